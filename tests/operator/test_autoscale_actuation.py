"""The parts between the decision and the cluster, without a cluster: reading the pods' /metrics (bounded, timed
out), turning scrapes into observations, and the drain plan (victims, cordon, release, un-cordon)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from atom_engine.server.metrics import ServerMetrics
from atom_engine.stats import BatcherStats
from atom_localcluster.cluster import free_port
from atom_operator.autoscale import observe
from atom_operator.autoscale.drain import SETTLE_SECONDS, PodState, plan
from atom_operator.autoscale.scrape import Sample, parse, scrape
from hypothesis import given, settings
from hypothesis import strategies as st


def engine_text(**batcher: float) -> str:
    """/metrics as an engine renders it (its own metrics table), for these batcher figures."""
    return ServerMetrics("m", lambda: [BatcherStats(**batcher)]).render().decode()


def test_parse_reads_the_engines_own_format() -> None:
    values = parse(engine_text(running=3, waiting=2, arrived_prompt_tokens=1200, waiting_for_kv=1))
    assert values["vllm:num_requests_running"] == 3 and values["vllm:num_requests_waiting"] == 2
    assert values["atom:arrived_prompt_tokens_total"] == 1200 and values["atom:pd_waiting_for_kv"] == 1
    assert not any(k.endswith("_bucket") for k in values)
    assert values["vllm:time_to_first_token_seconds_count"] == 0


async def _serve(routes: dict[str, web.RequestHandler]) -> tuple[web.AppRunner, int]:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.mark.asyncio(loop_scope="session")
async def test_scrape_bounds_each_pod_by_its_timeout_and_all_by_the_concurrency() -> None:
    in_flight, most = [0], [0]

    async def good(_r: web.Request) -> web.Response:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.05)
        in_flight[0] -= 1
        return web.Response(text=engine_text(running=1))

    async def slow(_r: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="")

    async def broken(_r: web.Request) -> web.Response:
        return web.Response(status=500)

    async def garbage(_r: web.Request) -> web.Response:
        return web.Response(text="<html>not metrics</html>")

    runner, port = await _serve({"/good": good, "/slow": slow, "/broken": broken, "/garbage": garbage})
    base = f"http://127.0.0.1:{port}"
    urls = {f"good-{i}": f"{base}/good" for i in range(9)}
    urls |= {"slow": f"{base}/slow", "broken": f"{base}/broken", "garbage": f"{base}/garbage",
             "refused": f"http://127.0.0.1:{free_port()}/metrics"}  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            began = time.monotonic()
            found = await scrape(session, urls, concurrency=3, timeout=0.5)
            took = time.monotonic() - began
    finally:
        await runner.cleanup()
    assert all(found[f"good-{i}"].get("vllm:num_requests_running") == 1 for i in range(9))
    assert [n for n, s in found.items() if s is None] == ["slow", "broken", "garbage", "refused"]
    assert most[0] <= 3  # never more than the bound at once
    assert took < 3.0  # the slow pod cost its timeout, not its 5 s


def _pod(name: str, t0: float, t1: float, before: dict, after: dict, *, ready=True, draining=False):
    return observe.PodReading(name, ready, draining, Sample(t1, after), Sample(t0, before))


def test_a_request_waiting_counts_as_queued_for_a_lane_only_at_a_pod_whose_lanes_are_all_held() -> None:
    full = _pod("d-a", 0, 5, {}, {observe.RUNNING: 4, observe.WAITING: 2})
    admitting = _pod("d-b", 0, 5, {}, {observe.RUNNING: 3, observe.WAITING: 1})  # a lane free: admitted next step
    role = observe.RoleReading(2, [full, admitting])
    assert observe.decode_observation(role, lanes=4).queued_for_lane == 2
    assert observe.decode_observation(role, lanes=4).sequences == 10  # both still count as the pods' sequences
    assert observe.decode_observation(role).queued_for_lane == 3  # lanes unknown: every waiting request


def test_observations_sum_gauges_and_rate_counters_from_two_scrapes() -> None:
    a = _pod("d-a", 0, 10, {observe.ARRIVED_TOKENS: 0, observe.ARRIVED_REQUESTS: 0},
             {observe.RUNNING: 3, observe.WAITING: 1, observe.WAITING_FOR_KV: 1, observe.ARRIVED_TOKENS: 2000,
              observe.ARRIVED_REQUESTS: 10})  # fmt: skip
    b = _pod("d-b", 0, 10, {observe.ARRIVED_TOKENS: 500, observe.ARRIVED_REQUESTS: 5},
             {observe.RUNNING: 2, observe.ARRIVED_TOKENS: 1500, observe.ARRIVED_REQUESTS: 10})  # fmt: skip
    restarted = _pod("d-c", 0, 10, {observe.ARRIVED_TOKENS: 9000}, {observe.RUNNING: 1, observe.ARRIVED_TOKENS: 10})
    gone = observe.PodReading("d-d", True, False, None)
    cordoned = _pod("d-e", 0, 10, {}, {observe.RUNNING: 4}, draining=True)
    loading = observe.PodReading("d-f", False, False, None)
    d = observe.decode_observation(observe.RoleReading(6, [a, b, restarted, gone, cordoned, loading]))
    assert (d.replicas, d.ready, d.answered, d.draining) == (6, 4, 3, 1)
    assert d.sequences == 3 + 1 + 2 + 1 and d.waiting_for_kv == 1  # the cordoned pod's 4 are not demand
    assert d.arrived_tokens_per_second == pytest.approx(200 + 100)  # the restarted pod gives no rate
    assert d.arrived_requests_per_second == pytest.approx(1 + 0.5)
    # The window's counts: arrivals summed over the pods with two scrapes (no max_tokens reported: None).
    assert d.counts is not None and (d.counts.seconds, d.counts.requests, d.counts.prompt_tokens) == (10, 15, 3000)
    assert d.counts.max_tokens is None and d.running == 3 + 2 + 1

    x = _pod("d-x", 0, 5, {observe.ARRIVED_REQUESTS: 0, observe.ARRIVED_MAX_TOKENS: 0, observe.DECODE_SECONDS: 1,
                           observe.DECODED_MAX_TOKENS: 100},
             {observe.ARRIVED_REQUESTS: 2, observe.ARRIVED_MAX_TOKENS: 300, observe.DECODE_SECONDS: 6,
              observe.DECODED_MAX_TOKENS: 200})  # fmt: skip
    c = observe.decode_observation(observe.RoleReading(1, [x])).counts
    assert (c.end, c.seconds, c.requests, c.max_tokens) == (5, 5, 2, 300)
    assert (c.decode_seconds, c.decoded_max_tokens) == (5, 100)

    w1 = _pod("p-a", 0, 10, {observe.BUSY: 1, observe.COMPUTED: 0},
              {observe.BUSY: 6, observe.COMPUTED: 2500, observe.TOKENS_WAITING: 300})  # fmt: skip
    w2 = _pod("p-b", 0, 10, {observe.BUSY: 0, observe.COMPUTED: 0}, {observe.BUSY: 5, observe.COMPUTED: 2500})
    p = observe.prefill_observation(observe.RoleReading(2, [w1, w2]))
    assert p.busy_seconds_per_second == pytest.approx(1.0) and p.busy_seconds == 10
    assert p.tokens_per_busy_second == pytest.approx(500) and p.waiting_tokens == 300


def test_idle_needs_nothing_in_flight_and_an_idle_engine() -> None:
    assert observe.idle(Sample(0, {observe.IN_FLIGHT: 0, observe.ENGINE_IDLE: 1}))
    assert observe.idle(Sample(0, {observe.IN_FLIGHT: 0}))  # a prefill worker has no batcher
    assert not observe.idle(Sample(0, {observe.IN_FLIGHT: 1, observe.ENGINE_IDLE: 1}))
    assert not observe.idle(Sample(0, {observe.IN_FLIGHT: 0, observe.ENGINE_IDLE: 0}))
    assert not observe.idle(Sample(0, {}))  # an engine without the figure is not known to be idle
    assert not observe.idle(None)


# ------------------------------------------------------------------------------------------------------- drain

def pod(name: str, in_flight: float | None = 0, *, ready=True, created=0.0, since=None, cost=False) -> PodState:
    return PodState(name, ready, in_flight, in_flight == 0, created, since, cost)


def test_the_victim_is_the_idlest_ready_pod_and_the_newest_on_a_tie() -> None:
    pods = [pod("a", 3, created=1), pod("b", 1, created=2), pod("c", 1, created=3), pod("d", 5, created=4)]
    p = plan(pods, replicas=4, desired=3, now=100, timeout=600)
    assert p.cordon == ("c",) and p.replicas == 4 and p.draining == ("c",)


def test_a_pod_not_ready_goes_first_and_without_waiting() -> None:
    pods = [pod("a", 0), pod("loading", None, ready=False, created=9)]
    p = plan(pods, replicas=2, desired=1, now=0, timeout=600)
    assert p.cordon == ("loading",)
    p = plan([pod("a", 0), pod("loading", None, ready=False, since=0)], 2, 1, now=0.1, timeout=600)
    assert p.mark == ("loading",) and p.replicas == 2


def test_a_pod_not_ready_goes_before_a_ready_pod_already_draining() -> None:
    # A drain of "v" is under way (or resumes after a restart) when a pod that is still starting appears: the
    # ReplicaSet ranks a not-Ready pod below any deletion cost, so it is the one to go; "v" serves again.
    pods = [pod("a", 2), pod("v", 1, since=0.0), pod("starting", None, ready=False, created=50)]
    p = plan(pods, replicas=3, desired=2, now=10, timeout=600)
    assert p.draining == ("starting",) and p.uncordon == ("v",)
    assert p.cordon == ("starting",) and p.mark == ("starting",)  # nothing to wait for: cordon and mark at once
    p = plan([pod("a", 2), pod("v", 0, since=0.0, cost=True), pod("starting", None, ready=False, since=10)],
             replicas=3, desired=2, now=20, timeout=600)  # fmt: skip
    assert p.draining == ("starting",) and p.uncordon == ("v",) and p.replicas == 3


def test_a_drained_pod_is_not_released_while_a_not_ready_victim_is_not() -> None:
    # Two to go: "v" drained and marked, "starting" cordoned but its cost not seen yet. Lowering replicas by one
    # now would make the ReplicaSet remove "starting" (not Ready ranks first), not "v": wait for both.
    pods = [pod("a", 2), pod("v", 0, since=0.0, cost=True), pod("starting", None, ready=False, since=5)]
    p = plan(pods, replicas=3, desired=1, now=20, timeout=600)
    assert set(p.draining) == {"v", "starting"} and p.replicas == 3 and p.mark == ("starting",)
    pods[2] = pod("starting", None, ready=False, since=5, cost=True)
    assert plan(pods, replicas=3, desired=1, now=21, timeout=600).replicas == 1


def test_a_drain_waits_for_idle_then_marks_then_releases() -> None:
    busy = [pod("a", 2), pod("v", 4, since=0.0)]
    assert plan(busy, 2, 1, now=10, timeout=600).replicas == 2 and not plan(busy, 2, 1, 10, 600).mark
    quiet_too_soon = [pod("a", 2), pod("v", 0, since=0.0)]
    assert not plan(quiet_too_soon, 2, 1, now=SETTLE_SECONDS / 2, timeout=600).mark
    quiet = plan(quiet_too_soon, 2, 1, now=SETTLE_SECONDS, timeout=600)
    assert quiet.mark == ("v",) and quiet.replicas == 2  # the cost first; replicas only once it is seen applied
    marked = [pod("a", 2), pod("v", 0, since=0.0, cost=True)]
    assert plan(marked, 2, 1, now=20, timeout=600).replicas == 1


def test_a_drain_that_times_out_releases_the_pod_anyway() -> None:
    stuck = [pod("a", 0), pod("v", 3, since=0.0)]
    p = plan(stuck, 2, 1, now=600, timeout=600)
    assert p.mark == ("v",) and p.timed_out == ("v",)


def test_load_coming_back_uncordons_without_a_cold_start() -> None:
    draining = [pod("a", 2), pod("v", 1, since=0.0), pod("w", 0, since=0.0, cost=True)]
    p = plan(draining, replicas=3, desired=3, now=5, timeout=600)
    assert set(p.uncordon) == {"v", "w"} and p.replicas == 3 and not p.cordon and not p.mark
    p = plan(draining, replicas=3, desired=2, now=5, timeout=600)  # one drain still wanted: the readier one stays
    assert p.draining == ("w",) and p.uncordon == ("v",) and p.replicas == 2


def test_turning_autoscaling_off_or_a_new_decision_leaves_nothing_cordoned() -> None:
    # A restart finds two pods cordoned and a decision that keeps every pod.
    pods = [pod("a", 0, since=1.0), pod("b", 0, since=2.0, cost=True), pod("c", 0)]
    assert set(plan(pods, 3, 3, now=50, timeout=600).uncordon) == {"a", "b"}


POD = st.builds(
    PodState,
    name=st.text("abcdefgh", min_size=1, max_size=3),
    ready=st.booleans(),
    in_flight=st.one_of(st.none(), st.integers(0, 5)),
    idle=st.booleans(),
    created=st.floats(0, 100),
    cordoned_since=st.one_of(st.none(), st.floats(0, 100)),
    cost_applied=st.booleans(),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(POD, min_size=1, max_size=8, unique_by=lambda p: p.name), st.integers(0, 8), st.floats(0, 200))
def test_a_plan_never_releases_a_pod_it_did_not_drain(pods: list[PodState], desired: int, now: float) -> None:
    replicas = len(pods)
    p = plan(pods, replicas, desired, now, timeout=120)
    by_name = {x.name: x for x in pods}
    assert p.replicas >= min(desired, replicas)  # never below the decision
    assert replicas - p.replicas <= len(p.draining)  # each pod released was a victim ...
    released = replicas - p.replicas
    fit = [n for n in p.draining if by_name[n].cost_applied and by_name[n].cordoned_since is not None]
    assert released <= len(fit)  # ... cordoned, marked and seen so
    assert not set(p.cordon) & set(p.uncordon)
    assert len(p.draining) == max(0, replicas - desired)
    for name in p.uncordon:  # only pods that were cordoned or marked
        assert by_name[name].cordoned_since is not None or by_name[name].cost_applied


# ------------------------------------------------------------------------------------------------------- the loop

KEY = ("ns", "llm")


class FakeKube:
    """The writes the loop makes, and the stored object a merge patch of its status leaves (as the watch sees).
    As the API server does, a patch that names a resourceVersion other than the object's is refused (409), and
    every write moves it; ``lagging`` writes happen on the server while the watch has not shown them yet;
    ``unavailable`` status writes are refused with 503. A refusal is raised as Kube raises it (``refusal``)."""

    def __init__(self, owners: dict) -> None:
        self.owners, self.status_writes, self.events, self.lagging, self.unavailable = owners, [], [], 0, 0

    async def patch_status(self, kind: str, namespace: str, name: str, patch: dict) -> dict:
        from atom_operator.kube import KubeError, refusal

        body = self.owners[(namespace, name)]
        stored = body["metadata"].get("resourceVersion")
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and (self.lagging or wanted != stored):
            raise refusal("PATCH status", KubeError(status=409, reason="Conflict"))
        if self.unavailable:
            self.unavailable -= 1
            raise refusal("PATCH status", KubeError(status=503, reason="Service Unavailable"))
        self.status_writes.append(patch)

        def merge(into: dict, p: dict) -> dict:
            for k, v in p.items():
                if v is None:
                    into.pop(k, None)
                elif isinstance(v, dict):
                    into[k] = merge(dict(into.get(k) or {}), v)
                else:
                    into[k] = v
            return into

        moved = {**body["metadata"], "resourceVersion": str(int(stored) + 1)} if stored else body["metadata"]
        status = merge(dict(body.get("status") or {}), patch["status"])
        self.owners[(namespace, name)] = {**body, "metadata": moved, "status": status}
        return self.owners[(namespace, name)]

    async def create(self, obj: dict) -> dict:
        self.events.append(obj["reason"])
        return obj

    def resource(self, kind: str):  # noqa: ANN201 - the pods' path, for their patches
        return type("R", (), {"path": staticmethod(lambda name, ns: f"/api/v1/namespaces/{ns}/pods/{name}")})

    async def request(self, method: str, path: str, **_kw: object) -> dict:
        return {}


def autoscaled_owner() -> dict:
    return {
        "apiVersion": "serving.atom.dev/v1alpha1", "kind": "AtomDeployment",
        "metadata": {"name": "llm", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "1"},
        "spec": {"model": {"source": "builtin:tiny"},
                 "decode": {"replicas": 2, "backend": "cpu", "npusPerReplica": 0, "lanes": 4, "kvBlocks": 6},
                 "autoscaling": {"mode": "Operator", "intervalSeconds": 15,
                                 "decode": {"minReplicas": 1, "maxReplicas": 3, "targetOccupancyPercent": 100}}},
    }  # fmt: skip


def autoscaler(monkeypatch: pytest.MonkeyPatch, owners: dict, running: list[float], clock: list[float],
               npus: list[int | None] | None = None):
    from atom_operator.autoscale import loop

    async def fake_scrape(_session, urls, **_kw):  # noqa: ANN001, ANN202
        if running[0] is None:  # the pods do not answer
            return dict.fromkeys(urls)
        return {n: Sample(clock[0], {observe.RUNNING: running[0], observe.WAITING: 0.0}) for n in urls}

    monkeypatch.setattr(loop, "scrape", fake_scrape)
    enqueued: list = []
    scaler = loop.Autoscaler(FakeKube(owners), owners, lambda _ns, _name: None, enqueued.append,
                             clock=lambda: clock[0], npus=lambda: (npus or [None])[0])  # fmt: skip
    scaler._session = object()  # type: ignore[assignment]  # scrape is replaced
    scaler.pods[KEY] = {
        n: loop.PodInfo(n, "decode", f"10.0.0.{i}", True, 0.0, None, False) for i, n in enumerate(("a", "b"))
    }
    return scaler, enqueued


@pytest.mark.asyncio(loop_scope="session")
async def test_decisions_that_change_nothing_write_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    owners = {KEY: autoscaled_owner()}
    running, clock = [2.0], [1000.0]
    scaler, _ = autoscaler(monkeypatch, owners, running, clock)
    await scaler.step(KEY)
    clock[0] += 15
    await scaler.step(KEY)  # the same observations, a later decision: lastDecisionTime alone would differ
    assert len(scaler.kube.status_writes) == 1
    written = owners[KEY]["status"]["autoscaling"]
    assert written["decode"]["desiredReplicas"] == 2 and "lastScaleTime" not in written["decode"]
    clock[0] += 15
    running[0] = 4.0  # 8 sequences on 4 lanes a pod: 2 pods -> the demand changed, so does the status
    await scaler.step(KEY)
    assert len(scaler.kube.status_writes) == 2
    # A restarted operator whose first decision finds the same in status writes nothing either.
    again, _ = autoscaler(monkeypatch, owners, running, clock)
    clock[0] += 15
    await again.step(KEY)
    assert len(again.kube.status_writes) == 0
    # One whose first decision finds the same conditions but no status.autoscaling writes that, not the conditions.
    del owners[KEY]["status"]["autoscaling"]
    other, _ = autoscaler(monkeypatch, owners, running, clock)
    clock[0] += 15
    await other.step(KEY)
    assert [set(w["status"]) for w in other.kube.status_writes] == [{"autoscaling"}], other.kube.status_writes


@pytest.mark.asyncio(loop_scope="session")
async def test_the_words_that_describe_the_load_are_refreshed_not_written_at_every_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from atom_operator.autoscale.loop import WORDS_REFRESH_SECONDS

    owners = {KEY: autoscaled_owner()}
    running, clock = [2.0], [1000.0]
    scaler, _ = autoscaler(monkeypatch, owners, running, clock)
    await scaler.step(KEY)
    assert len(scaler.kube.status_writes) == 1
    running[0] = 1.8  # 3.6 sequences instead of 4.0: the same counts, other words
    clock[0] += 15
    await scaler.step(KEY)
    assert len(scaler.kube.status_writes) == 1
    assert owners[KEY]["status"]["autoscaling"]["decode"]["demand"].startswith("4.0 sequences")
    clock[0] += WORDS_REFRESH_SECONDS - 15  # the refresh is due
    await scaler.step(KEY)
    assert len(scaler.kube.status_writes) == 2
    assert owners[KEY]["status"]["autoscaling"]["decode"]["demand"].startswith("3.6 sequences")


@pytest.mark.asyncio(loop_scope="session")
async def test_hpa_conditions_go_to_status_conditions_beside_the_reconcilers(monkeypatch: pytest.MonkeyPatch) -> None:
    from atom_operator import status
    from atom_operator.api import AtomDeployment
    from atom_operator.children import Owner

    owners = {KEY: autoscaled_owner()}
    owners[KEY]["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady"}]}
    running, clock = [2.0], [1000.0]
    scaler, enqueued = autoscaler(monkeypatch, owners, running, clock)
    assert scaler.conditions(KEY) == ()  # autoscaling on, nothing decided or stored yet
    await scaler.step(KEY)
    found = scaler.conditions(KEY)
    assert [c.type for c in found] == ["ScalingActive", "ScalingLimited", "AbleToScale"]
    # Written by the autoscaler with status.autoscaling, after the reconciler's own, guarded by the resourceVersion
    # the watch saw.
    stored = owners[KEY]["status"]["conditions"]
    assert [c["type"] for c in stored] == ["Ready", "ScalingActive", "ScalingLimited", "AbleToScale"]
    assert scaler.kube.status_writes[0]["metadata"] == {"resourceVersion": "1"}
    assert "conditions" not in owners[KEY]["status"]["autoscaling"]
    enqueued.clear()  # the first decision hands the reconciler its replicas
    clock[0] += 15
    await scaler.step(KEY)
    assert enqueued == [] and len(scaler.kube.status_writes) == 1  # unchanged: nothing written, nothing asked

    # A condition that changes is written without a reconcile (the pods stop answering: the counts hold) ...
    running[0], watched = None, owners[KEY]["metadata"]["resourceVersion"]
    clock[0] += 15
    await scaler.step(KEY)
    active = {c["type"]: c for c in owners[KEY]["status"]["conditions"]}["ScalingActive"]
    assert (active["status"], active["reason"]) == ("False", "MetricsUnavailable"), active
    assert enqueued == [] and {"metadata": {"resourceVersion": watched}} in [
        {k: w[k] for k in w if k == "metadata"} for w in scaler.kube.status_writes
    ]
    # ... and where the object moved since the watch saw it, the reconciler is asked to write them.
    scaler.kube.lagging = 1
    running[0] = 2.0
    clock[0] += 15
    await scaler.step(KEY)
    assert enqueued == [KEY]
    assert {c["type"]: c for c in owners[KEY]["status"]["conditions"]}["ScalingActive"]["status"] == "False"
    assert next(c for c in scaler.conditions(KEY) if c.type == "ScalingActive").ok  # what the reconciler writes

    # The reconciler's status: HPA's conditions beside Ready, where kubectl describe and kubectl wait look.
    spec = AtomDeployment.model_validate(owners[KEY]).spec
    seen = status.Observation(1, (), scaling=tuple(found))
    out = status.compute(Owner("llm", "ns", "u1", spec), seen, None, "2026-12-05T00:00:00Z")
    types = {c["type"]: c for c in out["conditions"]}
    assert {"Ready", "ScalingActive", "ScalingLimited", "AbleToScale"} <= set(types)
    assert types["ScalingActive"]["status"] == "True" and types["ScalingActive"]["reason"] == "ValidMetrics"
    # After a restart, before its first decision, the autoscaler hands back what status has (no flap) ...
    owners[KEY] = {**owners[KEY], "status": {**owners[KEY]["status"], "conditions": out["conditions"]}}
    fresh, _ = autoscaler(monkeypatch, owners, running, clock)
    assert [(c.type, c.ok, c.reason) for c in fresh.conditions(KEY)] == [(c.type, c.ok, c.reason) for c in found]
    # ... and none once autoscaling is off.
    owners[KEY]["spec"]["autoscaling"]["mode"] = "Off"
    assert fresh.conditions(KEY) is None


@pytest.mark.asyncio(loop_scope="session")
async def test_a_scale_down_is_announced_once_not_at_each_drain_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    owners = {KEY: autoscaled_owner()}
    running, clock = [0.0], [1000.0]
    scaler, _ = autoscaler(monkeypatch, owners, running, clock)
    await scaler.step(KEY)  # the start's down window holds the count
    clock[0] += 300
    await scaler.step(KEY)  # 2 -> 1: a victim is cordoned; the Deployment keeps 2 until it drained
    assert scaler.kube.events == ["ScaledDown", "DrainStarted"]
    writes = len(scaler.kube.status_writes)
    for _ in range(2):  # the drain goes on (the watch has not shown the cordon): the same decision each time
        clock[0] += 15
        await scaler.step(KEY)
    assert scaler.kube.events.count("ScaledDown") == 1
    assert len(scaler.kube.status_writes) == writes  # lastScaleTime stays the scale's


@pytest.mark.asyncio(loop_scope="session")
async def test_a_scale_whose_status_writes_are_refused_is_still_announced_and_written_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reconciler wrote status since the watch saw it (the guarded write of the conditions conflicts) and the
    API server refuses the plain write too: the scale still goes out (its Event, the drain, the reconciler asked
    for the conditions), and the next decision writes status.autoscaling."""
    owners = {KEY: autoscaled_owner()}
    running, clock = [0.0], [1000.0]
    scaler, enqueued = autoscaler(monkeypatch, owners, running, clock)
    await scaler.step(KEY)  # the start's down window holds the count
    written = len(scaler.kube.status_writes)
    enqueued.clear()
    scaler.kube.lagging, scaler.kube.unavailable = 1, 1
    clock[0] += 300
    await scaler.step(KEY)  # 2 -> 1
    assert scaler.kube.events == ["ScaledDown", "DrainStarted"]
    assert len(scaler.kube.status_writes) == written and enqueued == [KEY]
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 2  # not written yet
    scaler.kube.lagging = 0
    clock[0] += 15
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 1
    assert scaler.kube.events.count("ScaledDown") == 1


def test_a_pod_the_scheduler_cannot_place_is_seen_with_the_time_since() -> None:
    from atom_operator.autoscale import loop

    body = {
        "metadata": {"name": "d-x", "labels": {"app.kubernetes.io/component": "decode"},
                     "creationTimestamp": "2026-12-05T08:00:00Z"},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "lastTransitionTime": "2026-12-05T08:00:01Z",
             "message": "0/1 nodes are available: 1 Insufficient rebellions.ai/npu."}]},
    }  # fmt: skip
    pod = loop.PodInfo.of(body)
    assert pod.unschedulable_since == pod.created + 1 and not pod.ready
    body["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    assert loop.PodInfo.of(body).unschedulable_since is None


@pytest.mark.asyncio(loop_scope="session")
async def test_a_pod_pending_as_unschedulable_for_a_minute_limits_the_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode wants 3 pods; the third is Pending as unschedulable. Within the first minute it counts toward the
    target as any starting pod; after it, the cluster's room is the 2 pods placed: ScalingLimited/InsufficientNPUs,
    and the count falls back to 2 (the stuck pod is the victim, being not Ready)."""
    from atom_operator.autoscale import loop

    owners = {KEY: autoscaled_owner()}
    owners[KEY]["spec"]["decode"]["replicas"] = 3
    running, clock = [6.0], [1000.0]  # 12 sequences on two pods of 4 lanes at 100 %: 3 pods
    scaler, _ = autoscaler(monkeypatch, owners, running, clock)
    scaler.pods[KEY]["c"] = loop.PodInfo("c", "decode", None, False, 990.0, None, False, 990.0)
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 3
    assert [(c.type, c.status) for c in scaler.tracked[KEY].conditions if c.type == "ScalingLimited"] == [
        ("ScalingLimited", "False")]  # fmt: skip
    clock[0] += 60
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 2, owners[KEY]["status"]["autoscaling"]
    limited = next(c for c in scaler.tracked[KEY].conditions if c.type == "ScalingLimited")
    assert (limited.status, limited.reason) == ("True", "InsufficientNPUs") and "2 pods" in limited.message
    # A pod being deleted is seen until it is gone (it holds what it requested), and a relist starts afresh.
    gone = {"metadata": {"name": "a", "deletionTimestamp": "2026-12-05T08:00:00Z",
                         "labels": {"app.kubernetes.io/component": "decode"}}}  # fmt: skip
    scaler.event("Pod", "MODIFIED", gone, KEY)
    assert "a" not in scaler.pods[KEY] and scaler.terminating[KEY] == {"a": "decode"}
    scaler.event("Pod", "DELETED", gone, KEY)
    assert scaler.terminating[KEY] == {}


@pytest.mark.asyncio(loop_scope="session")
async def test_a_probe_turned_away_is_given_up_at_the_next_decision_and_a_node_joining_probes_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The room read (2 pods of 3 placed), its memory lapses: the decision asks for 3 again (a probe). The scheduler
    turns the new pod away at once, and the next decision, 15 s later, gives it up: not a minute later. Then the
    nodes' allocatable NPUs grow (a node joined): the next decision asks for 3 at once, the room's memory unspent."""
    from atom_operator.autoscale import loop

    owners = {KEY: autoscaled_owner()}
    owners[KEY]["spec"]["decode"]["replicas"] = 3
    running, clock, npus = [6.0], [1000.0], [4]  # 12 sequences on two pods of 4 lanes at 100 %: 3 pods
    scaler, _ = autoscaler(monkeypatch, owners, running, clock, npus)
    scaler.pods[KEY]["c"] = loop.PodInfo("c", "decode", None, False, 930.0, None, False, 930.0)
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 2  # stuck for 70 s: the room
    del scaler.pods[KEY]["c"]  # the ReplicaSet removed it
    memory = scaler.tracked[KEY].state.capacity.memory
    clock[0] += memory + 1
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 3  # the probe
    scaler.pods[KEY]["d"] = loop.PodInfo("d", "decode", None, False, clock[0] + 1, None, False, clock[0] + 1)
    clock[0] += 15
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 2, owners[KEY]["status"]
    assert scaler.tracked[KEY].state.capacity.memory == 2 * memory
    del scaler.pods[KEY]["d"]
    clock[0] += 15
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 2  # the room holds
    npus[0] = 8
    clock[0] += 15
    await scaler.step(KEY)
    assert owners[KEY]["status"]["autoscaling"]["decode"]["desiredReplicas"] == 3, owners[KEY]["status"]

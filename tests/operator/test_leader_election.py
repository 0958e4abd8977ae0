"""Two operator replicas on one Lease, as the chart runs them: the leader is killed mid-reconcile (a failpoint exits
it right after a write), the standby takes over within the Lease's duration and converges the children exactly,
no write of the two overlaps or repeats another, and the standby's webhook answers throughout. A leader that loses
the Lease while it runs (its Lease requests hang, or it reads another holder) exits with code 3 before anyone else
may lead."""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path

import pytest
import yaml
from atom_localcluster.wait import wait_for
from atom_operator import webhook
from atom_operator.lease import LeaseSettings
from atom_operator.main import EXIT_LEASE_LOST

from tests.operator.conftest import atomdeployment
from tests.operator.process import OperatorProcess
from tests.operator.test_reconciler import PD, assert_children_exactly, create, ready

pytestmark = pytest.mark.cluster
CRASH_AFTER = 3  # writes into the namespace: a ConfigMap or two and a Service, mid-reconcile
LEASE = LeaseSettings(namespace="default")


def lease_env(namespace: str, identity: str) -> dict[str, str]:
    return {"ATOM_NAMESPACES": namespace, "ATOM_LEASE_NAMESPACE": LEASE.namespace,
            "ATOM_LEASE_NAME": f"ha-{namespace}", "ATOM_LEASE_IDENTITY": identity}  # fmt: skip


def replica(cluster, tmp_path: Path, identity: str) -> OperatorProcess:  # noqa: ANN001
    (tmp_path / identity).mkdir()
    return OperatorProcess(cluster, tmp_path / identity)


def child_writes(writes: list[dict]) -> list[tuple[str, str]]:
    """(resource, name) of each write to a child: no Event, no status."""
    refs = [w.get("objectRef") or {} for w in writes]
    return [(r.get("resource", ""), r.get("name", "")) for r in refs
            if r.get("resource") != "events" and not r.get("subresource")]


def landed(writes: list[dict]) -> list[dict]:
    """The writes the API server carried out. A write still in flight when its client died may be cut short there
    (its request's context ends with the connection): audited, but failed, and the next leader has to make it."""
    return [w for w in writes if (w.get("responseStatus") or {}).get("code", 0) in range(200, 300)]


def written_by(writes: list[dict], identity: str) -> list[dict]:
    """The writes of one replica: its client names its Lease identity in the user agent."""
    return [w for w in writes if w.get("userAgent", "").endswith(f"/{identity}")]


def logged_at(process: OperatorProcess, event: str) -> datetime.datetime:
    """When the process logged ``event`` first (its log's asctime: both replicas run on this machine's clock)."""
    line = next(line for line in process.log().splitlines() if event in line)
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def test_the_standby_takes_over_a_killed_leader_and_converges_exactly(cluster, op, namespace, tmp_path) -> None:
    op.stop()  # the session's operator would reconcile this namespace too
    leader, standby = replica(cluster, tmp_path, "a"), replica(cluster, tmp_path, "b")
    hook = f"ha-{namespace}"
    asked = threading.Event()
    answers: list[str] = []
    try:
        leader.start(ATOM_FAILPOINT=f"exit-after-write:{CRASH_AFTER}:{namespace}", **lease_env(namespace, "a"))
        leader.wait_log(r"event=leading", timeout=60)
        standby.start(**lease_env(namespace, "b"))  # ready: caches synced, standing by
        # The standby's webhook, with failurePolicy Fail: a write it does not answer is refused.
        config = webhook.configuration(
            {"url": f"https://127.0.0.1:{standby.webhook_port}", "caBundle": webhook.ca_bundle(standby.ca)},
            name=hook, namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        )
        config["webhooks"][0]["failurePolicy"] = "Fail"
        cluster.apply(config)
        # Its warning about a claim that does not exist comes from its own cache of the claims.
        volume = {"persistentVolumeClaim": {"claimName": "missing"}}
        unclaimed = atomdeployment("probe", namespace, model={"source": "/models/x", "volume": volume})

        def answer() -> str:
            out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(unclaimed), check=False)
            if out.returncode == 0 and "'missing' does not exist" in out.stderr:
                return "warned"
            return f"rc={out.returncode} {out.stderr.strip()[:200]}"

        def ask() -> None:
            while not asked.is_set():
                answers.append(answer())
                time.sleep(0.5)

        wait_for(lambda: answer() == "warned", "the standby's webhook answering")
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()

        spec = create(cluster, namespace, **PD)
        assert leader.wait_exit(timeout=120) == 137, leader.log()[-3000:]
        killed = time.monotonic()
        by_leader = written_by(leader.writes(namespace), "a")
        assert len(by_leader) >= CRASH_AFTER
        standby.wait_log(r"event=leading", timeout=LEASE.duration + 30)
        took_over = time.monotonic() - killed
        print(f"takeover seconds={took_over:.1f} lease_duration={LEASE.duration}")
        # Timed from the last renewal it saw, at most one retry period before the kill.
        assert took_over <= LEASE.duration + 2 * LEASE.retry + 3, took_over

        wait_for(lambda: ready(cluster, namespace), "Ready under the new leader")
        assert_children_exactly(cluster, namespace, spec)
        time.sleep(2)
        asked.set()
        asker.join(timeout=30)

        writes = standby.writes(namespace)
        old, new = written_by(writes, "a"), written_by(writes, "b")
        assert len(old) + len(new) == len(writes) and old == by_leader
        # Only the leader writes: every write of the new one began after the last of the old one ended.
        assert new and max(w["stageTimestamp"] for w in old) < min(w["requestReceivedTimestamp"] for w in new)
        taken = child_writes(new)
        # Each child written once: the new leader left alone what the old one had written, and repeated nothing.
        codes = [((w.get("objectRef") or {}).get("name"), (w.get("responseStatus") or {}).get("code")) for w in old]
        assert not set(child_writes(landed(by_leader))) & set(taken), (child_writes(by_leader), taken, codes)
        assert len(set(taken)) == len(taken), taken
        assert answers and set(answers) == {"warned"}, answers
    finally:
        asked.set()
        cluster.kubectl("delete", "validatingwebhookconfiguration", hook, check=False)
        leader.stop()
        standby.stop()
        op.start()


def test_a_stopped_leader_hands_the_lease_back_at_once(cluster, op, namespace, tmp_path) -> None:
    op.stop()
    first, second = replica(cluster, tmp_path, "a"), replica(cluster, tmp_path, "b")
    try:
        first.start(**lease_env(namespace, "a"))
        first.wait_log(r"event=leading", timeout=60)
        second.start(**lease_env(namespace, "b"))
        create(cluster, namespace)
        wait_for(lambda: ready(cluster, namespace), "Ready")
        stopped = time.monotonic()
        first.stop()  # SIGTERM: releases the Lease
        second.wait_log(r"event=leading", timeout=LEASE.duration)
        print(f"handover seconds={time.monotonic() - stopped:.1f}")
        lease = cluster.get("lease", f"ha-{namespace}", "-n", LEASE.namespace)
        assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] >= 1
        cluster.kubectl("scale", "atomdeployment/llm", "-n", namespace, "--replicas=2")
        wait_for(lambda: (obj := ready(cluster, namespace)) and obj["status"]["decode"]["readyReplicas"] == 2,
                 "the new leader reconciles")
    finally:
        first.stop()
        second.stop()
        op.start()


def test_a_leader_whose_lease_requests_hang_exits_before_the_standby_leads(cluster, op, namespace, tmp_path) -> None:
    """Its writes still go through, so only its own renew deadline stops it: each renewal is bounded by the time
    left before that deadline, not by the client's timeout (which could outlast the Lease)."""
    op.stop()
    leader, standby = replica(cluster, tmp_path, "a"), replica(cluster, tmp_path, "b")
    try:
        # Every Lease request after the one that took it hangs; the leader reconciles meanwhile.
        leader.start(ATOM_FAILPOINT="hang-lease-after:1", **lease_env(namespace, "a"))
        leader.wait_log(r"event=leading", timeout=60)
        standby.start(**lease_env(namespace, "b"))
        spec = create(cluster, namespace, **PD)
        assert leader.wait_exit(timeout=LEASE.duration + 60) == EXIT_LEASE_LOST, leader.log()[-3000:]
        assert "reason=renew_deadline" in leader.log()
        standby.wait_log(r"event=leading", timeout=LEASE.duration + 30)
        assert logged_at(leader, "event=leadership_lost") < logged_at(standby, "event=leading")

        wait_for(lambda: ready(cluster, namespace), "Ready under the new leader")
        assert_children_exactly(cluster, namespace, spec)
        writes = standby.writes(namespace)
        old, new = written_by(writes, "a"), written_by(writes, "b")
        assert len(old) + len(new) == len(writes)
        # Only one writer at a time: every write of the new leader began after the last of the old one ended.
        assert not (old and new) or max(w["stageTimestamp"] for w in old) < min(
            w["requestReceivedTimestamp"] for w in new)  # fmt: skip
    finally:
        leader.stop()
        standby.stop()
        op.start()


def test_a_leader_that_reads_another_holder_exits_at_once_and_leaves_the_lease_alone(
    cluster, op, namespace, tmp_path
) -> None:
    op.stop()
    leader = replica(cluster, tmp_path, "a")
    name = f"ha-{namespace}"
    try:
        leader.start(**lease_env(namespace, "a"))
        leader.wait_log(r"event=leading", timeout=60)

        def take() -> bool:  # at the resourceVersion read: a renewal in between makes it a conflict, tried again
            lease = cluster.get("lease", name, "-n", LEASE.namespace)
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            lease["spec"].update(holderIdentity="intruder", renewTime=now, leaseDurationSeconds=3600)
            return cluster.kubectl("replace", "-f", "-", input=yaml.safe_dump(lease), check=False).returncode == 0

        wait_for(take, "the Lease taken by hand")
        assert leader.wait_exit(timeout=LEASE.renew_deadline + 30) == EXIT_LEASE_LOST, leader.log()[-3000:]
        # At its next read, not at its renew deadline; and it did not write the Lease back.
        assert "reason=taken" in leader.log()
        assert cluster.get("lease", name, "-n", LEASE.namespace)["spec"]["holderIdentity"] == "intruder"
    finally:
        leader.stop()
        op.start()

"""Leader election without an API server: the Lease kept in memory by a stand-in for the three calls the elector
makes (get, create, replace), with the API server's optimistic concurrency (a PUT at a stale resourceVersion is a
409), and a switch that makes one replica's calls hang, as on a network partition or an overloaded API server.

The property under test is the one the Lease exists for: two replicas never hold it at once. The cluster tier
(test_leader_election.py) runs two real operator processes on a real Lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import time
from collections.abc import AsyncIterator
from typing import Any

from atom_operator.kube import TransientError
from atom_operator.lease import LeaderElector, LeaseSettings

# Short, in the chart's proportions (15/10/2), so a test waits out a Lease in a second or two.
SETTINGS = LeaseSettings(namespace="ns", name="ha", duration=1.5, renew_deadline=1.0, retry=0.1)
BOUND = 10 * SETTINGS.duration  # a test that waits this long has failed: the elector never stepped down


class Leases:
    """The API server's Lease objects: a resourceVersion per write, a PUT at a stale one refused."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0

    def put(self, obj: dict[str, Any], create: bool) -> dict[str, Any]:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        stored = self.objects.get(key)
        if create and stored is not None:
            raise TransientError("create Lease: 409 AlreadyExists")
        if not create and (stored is None or stored["metadata"]["resourceVersion"] != obj["metadata"].get(
                "resourceVersion")):  # fmt: skip
            raise TransientError("replace Lease: 409 Conflict")
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.objects[key] = obj
        return copy.deepcopy(obj)

    def holder(self) -> str | None:
        return self.objects[(SETTINGS.namespace, SETTINGS.name)]["spec"].get("holderIdentity")


class Client:
    """One replica's view of :class:`Leases`, with the calls of :class:`atom_operator.kube.Kube` it uses."""

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        self.hanging = False  # every call from now on waits forever (until cancelled)
        self.calls: list[str] = []

    async def _answer(self, call: str) -> None:
        self.calls.append(call)
        await asyncio.sleep(0)
        if self.hanging:
            await asyncio.Event().wait()

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        await self._answer("get")
        found = self.leases.objects.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        await self._answer("create")
        return self.leases.put(obj, create=True)

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        await self._answer("replace")
        return self.leases.put(obj, create=False)


class Replica:
    """An elector and when it led: ``led`` when it began, ``stepped_down`` when ``run`` returned."""

    def __init__(self, leases: Leases, identity: str) -> None:
        self.client = Client(leases)
        self.elector = LeaderElector(self.client, LeaseSettings(**{**SETTINGS.__dict__, "identity": identity}))  # type: ignore[arg-type]
        self.led: float | None = None
        self.stepped_down: float | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        async def run() -> None:
            await self.elector.run(on_leading=lambda: setattr(self, "led", time.monotonic()))
            self.stepped_down = time.monotonic()

        self.task = asyncio.create_task(run())

    async def leading(self) -> None:
        await asyncio.wait_for(self.elector.leading.wait(), BOUND)

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@contextlib.asynccontextmanager
async def leader_and_standby() -> AsyncIterator[tuple[Leases, Replica, Replica]]:
    leases = Leases()
    a, b = Replica(leases, "a"), Replica(leases, "b")
    a.start()
    try:
        await a.leading()
        b.start()
        yield leases, a, b
    finally:
        await a.stop()
        await b.stop()


async def test_a_leader_whose_api_calls_hang_steps_down_before_the_standby_takes_over() -> None:
    async with leader_and_standby() as (leases, a, b):
        await asyncio.sleep(3 * SETTINGS.retry)  # a renews a few times; b has seen it
        a.client.hanging = True
        await asyncio.wait_for(asyncio.shield(a.task), BOUND)  # run returns: the caller stops writing and exits
        assert not a.elector.leading.is_set()
        await b.leading()
        assert leases.holder() == "b"
        # The safety property: the old leader had stopped before the new one began.
        assert a.stepped_down is not None and b.led is not None and a.stepped_down < b.led


async def test_a_leader_that_reads_another_holder_steps_down_at_that_read() -> None:
    async with leader_and_standby() as (leases, a, b):
        await b.stop()
        lease = leases.objects[(SETTINGS.namespace, SETTINGS.name)]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease["spec"].update(holderIdentity="c", renewTime=now)  # taken by hand, or by a replica that timed a out
        calls = len(a.client.calls)
        await asyncio.wait_for(asyncio.shield(a.task), BOUND)
        assert not a.elector.leading.is_set()
        # One read, and no write: it neither waited out its renew deadline nor wrote the Lease back.
        assert a.client.calls[calls:] == ["get"]
        assert leases.holder() == "c"


async def test_a_replica_whose_first_attempt_hangs_keeps_trying_and_leads_once_answered() -> None:
    leases = Leases()
    a = Replica(leases, "a")
    a.client.hanging = True
    a.start()
    await asyncio.sleep(SETTINGS.renew_deadline + 2 * SETTINGS.retry)  # the first attempt was given up
    assert a.led is None and len(a.client.calls) >= 2
    a.client.hanging = False
    await a.leading()
    assert leases.holder() == "a"
    await a.stop()


async def test_a_stop_does_not_wait_on_a_hung_api_server() -> None:
    leases = Leases()
    a = Replica(leases, "a")
    a.start()
    await a.leading()
    await a.stop()
    a.client.hanging = True
    await asyncio.wait_for(a.elector.release(), BOUND)  # gave up: the Lease expires as after a crash
    assert not a.elector.leading.is_set() and leases.holder() == "a"


async def test_atom_operator_leader_is_1_only_while_this_replica_holds_the_lease() -> None:
    """What AtomOperatorNotLeading reads (no replica at 1: nothing reconciles)."""
    from atom_operator import telemetry

    def leader() -> float | None:
        return telemetry.REGISTRY.get_sample_value("atom_operator_leader")

    telemetry.LEADER.set(0)
    a = Replica(Leases(), "a")
    a.start()
    try:
        await a.leading()
        assert leader() == 1
        a.client.hanging = True
        await asyncio.wait_for(asyncio.shield(a.task), BOUND)  # stepped down
        assert leader() == 0
    finally:
        await a.stop()

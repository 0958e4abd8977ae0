"""Leader election on a ``coordination.k8s.io`` Lease, as client-go's leaderelection does it: of the replicas, only
the holder of the Lease reconciles (writes); the others keep their caches warm and serve the webhook.

A replica takes the Lease when it is free or when its holder has not renewed it for ``duration`` seconds, timed on
the taker's own clock from when it last saw the renewal change (clocks of two machines are never compared). The
holder renews every ``retry`` seconds; one that could not renew for ``renew_deadline`` seconds (less than
``duration``) stops at once, before any other replica may take over, so two replicas never write at once. A
replica that stops cleanly hands the Lease back, and the next one takes it without waiting. Every write is a PUT
of the whole Lease at the resourceVersion read, so two replicas racing for it cannot both win.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from atom_operator import telemetry
from atom_operator.kube import Kube, KubeError, TransientError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str = "atom-operator"
    identity: str = ""  # unique per replica; the pod's name in the cluster
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0


class Attempt(Enum):
    """How one attempt on the Lease ended."""

    HELD = "held"  # taken or renewed: this replica holds it
    OTHER = "other"  # another replica holds it
    FAILED = "failed"  # no answer in time, a conflict or a refusal: held by whoever held it before


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, kube: Kube, settings: LeaseSettings) -> None:
        assert settings.renew_deadline < settings.duration, "the holder must give up before others may take over"
        self.kube, self.settings = kube, settings
        self.leading = asyncio.Event()  # set once this replica holds the Lease
        self._seen: tuple[Any, Any] | None = None  # (holder, renewTime) last read of another holder
        self._seen_at = 0.0

    async def run(self, on_leading: Callable[[], None]) -> None:
        """Take the Lease (then call ``on_leading``), then keep it; returns when it is lost: the caller must stop
        writing at once."""
        s = self.settings
        while True:
            started = time.monotonic()
            if await self._attempt(s.renew_deadline) is Attempt.HELD:
                break
            await asyncio.sleep(s.retry)
        log.info("event=leading lease=%s/%s identity=%s", s.namespace, s.name, s.identity)
        self.leading.set()
        telemetry.LEADER.set(1)
        on_leading()
        # Timed from when the attempt began, not when its answer came: the standby times the Lease from when it
        # sees the renewal, which is after the PUT reached the server, which is after this.
        renewed = started
        while True:
            await asyncio.sleep(max(0.0, min(s.retry, renewed + s.renew_deadline - time.monotonic())))
            started = time.monotonic()
            outcome = await self._attempt(renewed + s.renew_deadline - started)
            if outcome is Attempt.HELD:
                renewed = started
            elif outcome is Attempt.OTHER or time.monotonic() >= renewed + s.renew_deadline:
                self.leading.clear()
                telemetry.LEADER.set(0)
                reason = "taken" if outcome is Attempt.OTHER else "renew_deadline"
                log.error(
                    "event=leadership_lost lease=%s/%s identity=%s reason=%s", s.namespace, s.name, s.identity, reason
                )
                return

    async def release(self) -> None:
        """Hand the Lease back (on a clean stop), so another replica takes it at once."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        telemetry.LEADER.set(0)
        try:
            # Bounded: a stop must not wait on a hung API server; the Lease then expires as after a crash.
            async with asyncio.timeout(self.settings.renew_deadline):
                lease = await self.kube.get("Lease", self.settings.namespace, self.settings.name)
                if lease is not None and lease["spec"].get("holderIdentity") == self.settings.identity:
                    lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1, renewTime=_now())
                    await self.kube.replace(lease)
        except (KubeError, TransientError, TimeoutError) as e:
            log.warning("event=lease_not_released error=%r", e)

    async def _attempt(self, within: float) -> Attempt:
        """One attempt, given up (as FAILED) when it has not ended within ``within`` seconds."""
        if within <= 0:
            return Attempt.FAILED
        try:
            async with asyncio.timeout(within):
                return await self._try()
        except TimeoutError:
            s = self.settings
            log.warning("event=lease_attempt_timed_out lease=%s/%s seconds=%.1f", s.namespace, s.name, within)
            return Attempt.FAILED

    async def _try(self) -> Attempt:
        """One attempt to take or renew the Lease."""
        s = self.settings
        try:
            lease = await self.kube.get("Lease", s.namespace, s.name)
            now = _now()
            if lease is None:
                await self.kube.create(self._lease({"acquireTime": now, "renewTime": now, "leaseTransitions": 0}))
                return Attempt.HELD
            spec = lease.setdefault("spec", {})
            holder = spec.get("holderIdentity")
            if holder != s.identity:
                if holder and not self._expired(holder, spec):
                    return Attempt.OTHER
                spec.update(acquireTime=now, leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
            spec.update(holderIdentity=s.identity, leaseDurationSeconds=int(s.duration), renewTime=now)
            await self.kube.replace(lease)
            return Attempt.HELD
        except TransientError as e:  # a conflict (another replica wrote first), or the API server is away
            log.debug("event=lease_attempt_failed error=%s", e)
            return Attempt.FAILED
        except KubeError as e:  # refused: RBAC, say; said, and tried again
            log.warning("event=lease_attempt_failed error=%s", e)
            return Attempt.FAILED

    def _expired(self, holder: str, spec: dict[str, Any]) -> bool:
        """Whether ``holder`` has not renewed for its lease's duration, as timed here since its last renewal seen."""
        seen = (holder, spec.get("renewTime"))
        if seen != self._seen:
            self._seen, self._seen_at = seen, time.monotonic()
        duration = float(spec.get("leaseDurationSeconds") or self.settings.duration)
        return time.monotonic() - self._seen_at >= duration

    def _lease(self, spec: dict[str, Any]) -> dict[str, Any]:
        s = self.settings
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": s.name, "namespace": s.namespace},
            "spec": {"holderIdentity": s.identity, "leaseDurationSeconds": int(s.duration), **spec},
        }

"""How many CPUs this process may use, and so how many intra-op threads torch gets. Torch-free.

torch takes one thread per host core by default; in a container limited to 2 CPUs on a 64-core node that is 64
OpenMP threads in a 2-CPU CFS quota, and every parallel region then waits at its barrier for threads the kernel
has descheduled. The allowance is the smallest of what bounds the process:

- ``cpuThreads`` (the engine setting), else ``OMP_NUM_THREADS`` when the environment sets it: an explicit
  choice is the answer;
- the CFS quota of the process's cgroup and of every cgroup above it (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``), rounded up to whole CPUs;
- the pod's CPU limit and request, as the operator passes them through the downward API (``ATOM_CPU_LIMIT``,
  ``ATOM_CPU_REQUEST``, in millicores): the request is what the pod is sure of when the node is busy, so threads
  past it are the ones that get descheduled;
- the affinity mask (``os.sched_getaffinity``: cpusets, ``taskset``).

:func:`apply` sets torch's thread count at a process's start (the CLI's), and logs the count and why; the CLI
hands the :class:`Allowance` it returns to the server, whose /metrics shows it (``atom:cpu_threads_info``).

Right-sized threads are not enough where the node is busier than its pods' requests: a thread can still be
descheduled mid-region, and by default OpenMP's waiters spin at the barrier (libgomp spins long when the team has
no more threads than CPUs), burning the CPU time the late thread needs. So before torch loads, :func:`apply` sets
``OMP_WAIT_POLICY=PASSIVE`` (waiters sleep) unless the environment chose a policy; the figures are in
benchmarks/results/threads.md. OpenMP reads the variable once, when its library loads: a process that imported
torch first keeps the default, and the log says so.

Never the host's core count: that is the affinity mask at most.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CPU_LIMIT_ENV = "ATOM_CPU_LIMIT"  # millicores (the downward API's limits.cpu, divisor 1m)
CPU_REQUEST_ENV = "ATOM_CPU_REQUEST"  # millicores (requests.cpu, divisor 1m)
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


@dataclass(frozen=True)
class Allowance:
    """The thread count and what decided it (``source``: the bound that won; ``bounds``: every bound found)."""

    threads: int
    source: str
    bounds: tuple[tuple[str, float], ...]
    wait_policy: str = ""  # OpenMP's, as apply() left it ("" before apply)

    def describe(self) -> str:
        found = ",".join(f"{name}={value:g}" for name, value in self.bounds)
        policy = f" omp_wait_policy={self.wait_policy}" if self.wait_policy else ""
        return f"threads={self.threads} source={self.source} bounds={found or 'none'}{policy}"


@dataclass(frozen=True)
class _Mount:
    root: str  # the cgroup path the mount shows at its mount point (a container's namespace root: "/")
    point: Path
    version: int


def _mounts(proc: Path) -> list[_Mount]:
    """The cgroup mounts that carry a CPU quota: cgroup2, and v1 hierarchies with the ``cpu`` controller."""
    found = []
    for line in (proc / "self" / "mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            found.append(_Mount(fields[3], point, 2))
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(","):
            found.append(_Mount(fields[3], point, 1))
    return found


def _cgroup_paths(proc: Path) -> dict[int, str]:
    """The process's cgroup path per hierarchy kind: 2 for the unified one, 1 for the v1 ``cpu`` controller."""
    paths: dict[int, str] = {}
    for line in (proc / "self" / "cgroup").read_text().splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            paths[2] = path
        elif "cpu" in controllers.split(","):
            paths[1] = path
    return paths


def _quota(directory: Path, version: int) -> float | None:
    """CPUs the cgroup at ``directory`` may use per period (None: no quota there, or nothing readable)."""
    try:
        if version == 2:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
        else:
            quota = (directory / "cpu.cfs_quota_us").read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
    except (OSError, ValueError):
        return None
    if quota in ("max", "-1") or int(period) <= 0 or int(quota) <= 0:
        return None
    return int(quota) / int(period)


def cgroup_cpus(proc: Path = Path("/proc")) -> tuple[str, float] | None:
    """The tightest CFS quota over the process's cgroup and its ancestors, as ``(where, cpus)``."""
    try:
        mounts, paths = _mounts(proc), _cgroup_paths(proc)
    except OSError:
        return None
    best: tuple[str, float] | None = None
    for mount in mounts:
        path = paths.get(mount.version)
        if path is None:
            continue
        if not (path == mount.root or path.startswith(mount.root.rstrip("/") + "/")):
            continue  # the process's cgroup is outside what this mount shows
        parts = Path(os.path.relpath(path, mount.root)).parts
        parts = () if parts == (".",) else parts
        for depth in range(len(parts), -1, -1):  # a parent's quota binds its children too
            cpus = _quota(mount.point.joinpath(*parts[:depth]), mount.version)
            if cpus is not None and (best is None or cpus < best[1]):
                best = (f"cgroup-v{mount.version}", cpus)
    return best


def _positive_int(raw: str) -> int | None:
    try:
        value = int(raw.strip())
    except ValueError:
        return None
    return value if value > 0 else None


def _millicores(env: Mapping[str, str], name: str) -> float | None:
    value = _positive_int(env.get(name, ""))
    return None if value is None else value / 1000


def allowance(setting: int | None = None, *, proc: Path = Path("/proc"), env: Mapping[str, str] | None = None,
              affinity: int | None = None) -> Allowance:
    """The intra-op thread count for this process: ``setting`` when given, else the smallest bound (whole CPUs,
    rounded up: a quota of 1.5 CPUs runs two threads, each for 75% of the time)."""
    env = os.environ if env is None else env
    if affinity is None:
        affinity = len(os.sched_getaffinity(0))
    bounds: list[tuple[str, float]] = [("affinity", float(affinity))]
    if (quota := cgroup_cpus(proc)) is not None:
        bounds.append(quota)
    for name, key in (("pod-limit", CPU_LIMIT_ENV), ("pod-request", CPU_REQUEST_ENV)):
        if (cpus := _millicores(env, key)) is not None:
            bounds.append((name, cpus))
    if setting is not None:
        return Allowance(setting, "cpuThreads", tuple(bounds))
    if (omp := _positive_int(env.get("OMP_NUM_THREADS", ""))) is not None:
        return Allowance(omp, "OMP_NUM_THREADS", tuple(bounds))
    source, cpus = min(bounds, key=lambda b: b[1])
    return Allowance(max(1, math.ceil(cpus - 1e-9)), source, tuple(bounds))


def wait_policy(env: dict[str, str] | None = None, torch_loaded: bool | None = None) -> str:
    """OpenMP's wait policy for this process: the environment's when it sets one, else ``PASSIVE``, set in
    ``env`` (default ``os.environ``) while torch, and with it OpenMP, is not loaded yet; else ``default``."""
    env = os.environ if env is None else env
    if torch_loaded is None:
        torch_loaded = "torch" in sys.modules
    if env.get(WAIT_POLICY_ENV):
        return env[WAIT_POLICY_ENV]
    if torch_loaded:
        return "default"  # too late: OpenMP read its environment when torch loaded it
    env[WAIT_POLICY_ENV] = "PASSIVE"
    return "PASSIVE"


def apply(setting: int | None) -> Allowance:
    """Size torch's intra-op threads from :func:`allowance`, make OpenMP's waiters sleep (:func:`wait_policy`,
    before torch loads) and log the choice (one event line)."""
    import logging

    policy = wait_policy()
    import torch

    chosen = dataclasses.replace(allowance(setting), wait_policy=policy)
    torch.set_num_threads(chosen.threads)
    logging.getLogger("atom_engine").info("event=cpu_threads %s", chosen.describe())
    return chosen

"""Intra-op threads from the container's CPU allowance: cgroup quotas (v1 and v2, with their ancestors), the pod's
limit and request, the affinity mask, an explicit setting; never the host's core count. The cgroup and proc files
are real files in a temporary directory, laid out as the kernel lays them out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from atom_engine.cpu_allowance import CPU_LIMIT_ENV, CPU_REQUEST_ENV, allowance, cgroup_cpus, wait_policy
from atom_engine.settings import EngineSettings
from pydantic import ValidationError

HOST_CORES = 64  # what the affinity mask shows on a big node with no cpuset


def fake_proc(tmp: Path, cgroup: str, mounts: list[tuple[str, str, str, str]]) -> Path:
    """``/proc/self/cgroup`` and ``mountinfo`` (``mounts``: root, mount point, fstype, super options)."""
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(textwrap.dedent(cgroup).lstrip())
    lines = [f"{30 + i} 25 0:{40 + i} {root} {point} rw,nosuid,nodev,noexec,relatime shared:{i} - {fstype} cgroup"
             f" {opts}" for i, (root, point, fstype, opts) in enumerate(mounts)]
    lines.insert(0, "25 1 0:23 / / rw,relatime - overlay overlay rw,lowerdir=/x")
    (proc / "self" / "mountinfo").write_text("\n".join(lines) + "\n")
    return proc


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2(tmp: Path, path: str = "/", cpu_max: dict[str, str] | None = None) -> Path:
    root = tmp / "sys" / "fs" / "cgroup"
    root.mkdir(parents=True)
    for where, value in (cpu_max or {}).items():
        write(root / where.strip("/") / "cpu.max", value + "\n")
    return fake_proc(tmp, f"0::{path}\n", [("/", str(root), "cgroup2", "rw,nsdelegate")])


def v1(tmp: Path, path: str, quotas: dict[str, tuple[int, int]], mount_root: str = "/") -> Path:
    point = tmp / "sys" / "fs" / "cgroup" / "cpu,cpuacct"
    point.mkdir(parents=True)
    for where, (quota, period) in quotas.items():
        write(point / where.strip("/") / "cpu.cfs_quota_us", f"{quota}\n")
        write(point / where.strip("/") / "cpu.cfs_period_us", f"{period}\n")
    cgroup = f"""
        12:memory:{path}
        4:cpu,cpuacct:{path}
        1:name=systemd:{path}
        0::/
    """
    return fake_proc(tmp, cgroup, [(mount_root, str(point), "cgroup", "rw,cpu,cpuacct"),
                                   ("/", str(tmp / "mem"), "cgroup", "rw,memory")])


def test_a_v2_quota_of_two_cpus_gives_two_threads_on_a_64_core_host(tmp_path: Path) -> None:
    proc = v2(tmp_path, cpu_max={"/": "200000 100000"})
    got = allowance(proc=proc, env={}, affinity=HOST_CORES)
    assert (got.threads, got.source) == (2, "cgroup-v2")
    assert ("affinity", 64.0) in got.bounds


def test_no_quota_leaves_the_affinity_mask(tmp_path: Path) -> None:
    proc = v2(tmp_path, cpu_max={"/": "max 100000"})
    got = allowance(proc=proc, env={}, affinity=6)
    assert (got.threads, got.source) == (6, "affinity")


def test_a_fractional_quota_rounds_up(tmp_path: Path) -> None:
    proc = v2(tmp_path, cpu_max={"/": "150000 100000"})
    assert allowance(proc=proc, env={}, affinity=HOST_CORES).threads == 2
    proc = v2(tmp_path / "small", cpu_max={"/": "10000 100000"})  # 0.1 CPU still runs one thread
    assert allowance(proc=proc, env={}, affinity=HOST_CORES).threads == 1


def test_a_v2_parents_quota_binds_the_child(tmp_path: Path) -> None:
    proc = v2(tmp_path, "/kubepods/pod1/engine", {
        "/kubepods": "max 100000", "/kubepods/pod1": "300000 100000", "/kubepods/pod1/engine": "max 100000"})
    assert cgroup_cpus(proc) == ("cgroup-v2", 3.0)


def test_v1_cfs_quota_and_period_with_a_tighter_ancestor(tmp_path: Path) -> None:
    proc = v1(tmp_path, "/kubepods/burstable/pod1/c1", {
        "/": (-1, 100000), "/kubepods/burstable/pod1": (100000, 100000), "/kubepods/burstable/pod1/c1": (400000,
                                                                                                         100000)})
    got = allowance(proc=proc, env={}, affinity=HOST_CORES)
    assert (got.threads, got.source) == (1, "cgroup-v1")


def test_v1_unlimited_quota_is_no_bound(tmp_path: Path) -> None:
    proc = v1(tmp_path, "/", {"/": (-1, 100000)})
    assert cgroup_cpus(proc) is None


def test_a_container_namespace_mount_reads_its_own_root(tmp_path: Path) -> None:
    # Inside a container the cgroup mount shows the container's own cgroup at the mount point.
    proc = v1(tmp_path, "/docker/abc", {"/": (250000, 100000)}, mount_root="/docker/abc")
    assert cgroup_cpus(proc) == ("cgroup-v1", 2.5)


def test_the_pods_limit_and_request_bound_threads(tmp_path: Path) -> None:
    proc = v2(tmp_path, cpu_max={"/": "max 100000"})
    got = allowance(proc=proc, env={CPU_LIMIT_ENV: "4000", CPU_REQUEST_ENV: "1500"}, affinity=HOST_CORES)
    assert (got.threads, got.source) == (2, "pod-request")
    got = allowance(proc=proc, env={CPU_LIMIT_ENV: "3000"}, affinity=HOST_CORES)
    assert (got.threads, got.source) == (3, "pod-limit")


def test_an_explicit_setting_wins_and_omp_num_threads_is_explicit_too(tmp_path: Path) -> None:
    proc = v2(tmp_path, cpu_max={"/": "200000 100000"})
    assert allowance(8, proc=proc, env={"OMP_NUM_THREADS": "1"}, affinity=HOST_CORES).source == "cpuThreads"
    got = allowance(proc=proc, env={"OMP_NUM_THREADS": "1"}, affinity=HOST_CORES)
    assert (got.threads, got.source) == (1, "OMP_NUM_THREADS")
    assert "cgroup-v2=2" in got.describe()


def test_unreadable_cgroup_files_leave_the_other_bounds(tmp_path: Path) -> None:
    got = allowance(proc=tmp_path / "no-proc", env={}, affinity=3)
    assert (got.threads, got.source) == (3, "affinity")


def test_cpu_threads_setting_is_bounded_by_the_limits() -> None:
    assert EngineSettings(cpu_threads=4).cpu_threads == 4
    with pytest.raises(ValidationError, match="cpu_threads|cpuThreads"):
        EngineSettings(cpu_threads=0)


def test_the_engine_process_sets_torchs_threads_and_says_why() -> None:
    # A child process: torch's thread count is process-wide, and this test process runs on one thread.
    code = ("import logging, os, sys\n"
            "logging.basicConfig(level='INFO', stream=sys.stdout, format='%(message)s')\n"
            "from atom_engine import cpu_allowance\n"
            "chosen = cpu_allowance.apply(None)\n"
            "import torch\n"
            "print('got', torch.get_num_threads(), chosen.threads, os.environ['OMP_WAIT_POLICY'])\n")
    env = {"PATH": "/usr/bin:/bin", CPU_REQUEST_ENV: "1000"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert "event=cpu_threads threads=1 source=pod-request" in out
    assert "omp_wait_policy=PASSIVE" in out
    assert "got 1 1 PASSIVE" in out


def test_openmps_waiters_sleep_unless_the_environment_chose_or_torch_loaded_first() -> None:
    env: dict[str, str] = {}
    assert wait_policy(env, torch_loaded=False) == "PASSIVE"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}  # what OpenMP reads when torch loads it
    assert wait_policy({"OMP_WAIT_POLICY": "ACTIVE"}, torch_loaded=False) == "ACTIVE"
    assert wait_policy({"OMP_WAIT_POLICY": ""}, torch_loaded=False) == "PASSIVE"  # empty: not a choice
    late: dict[str, str] = {}
    assert wait_policy(late, torch_loaded=True) == "default"
    assert late == {}  # nothing set that would not take effect

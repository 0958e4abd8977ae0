"""The runc wrapper that lets ``docker run --privileged`` start where root lacks a capability (kind's nodes)."""

from __future__ import annotations

import json
from pathlib import Path

from atom_localcluster import runc_caps


def _spec(tmp_path: Path, caps: list[str]) -> Path:
    path = tmp_path / "config.json"
    sets = {k: list(caps) for k in ("bounding", "effective", "permitted")}
    path.write_text(json.dumps({"ociVersion": "1.0.2", "process": {"capabilities": sets, "args": ["/sbin/init"]}}))
    return path


def test_only_the_missing_capabilities_are_removed(tmp_path: Path) -> None:
    path = _spec(tmp_path, ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"])
    runc_caps.strip(str(path), ("process", "capabilities"), {"CAP_SYS_RESOURCE"})
    spec = json.loads(path.read_text())
    assert spec["process"]["capabilities"] == {k: ["CAP_CHOWN", "CAP_SYS_ADMIN"]
                                               for k in ("bounding", "effective", "permitted")}
    assert spec["process"]["args"] == ["/sbin/init"]


def test_a_spec_without_them_is_left_byte_for_byte(tmp_path: Path) -> None:
    path = _spec(tmp_path, ["CAP_CHOWN", "CAP_NET_RAW"])
    before = path.read_bytes()
    runc_caps.strip(str(path), ("process", "capabilities"), {"CAP_SYS_RESOURCE"})
    assert path.read_bytes() == before


def test_missing_caps_reads_the_bounding_set() -> None:
    status = Path("/proc/self/status").read_text()
    bounding = int(next(line for line in status.splitlines() if line.startswith("CapBnd:")).split()[1], 16)
    assert ("CAP_SYS_ADMIN" in runc_caps.missing_caps()) == (not bounding >> 21 & 1)
    assert runc_caps.CAPS[24] == "SYS_RESOURCE" and len(runc_caps.CAPS) == 41


def test_the_command_options_are_found() -> None:
    args = ["--root", "/run/x", "--log", "l.json", "create", "--bundle", "/b", "--pid-file", "p", "id"]
    assert runc_caps.option(args, "--bundle", "-b") == "/b"
    assert runc_caps.option(["exec", "--process=/p.json", "id"], "--process", "-p") == "/p.json"

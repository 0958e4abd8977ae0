"""The engine's process re-executes itself once under tcmalloc (atom_engine.malloc): same PID, at most one exec,
and not at all when switched off or already preloaded."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys

import pytest
from atom_engine import malloc

# Prints a line per start of the program: an exec shows as a second "start".
PROGRAM = """
import os
print("start", os.getpid(), flush=True)
from atom_engine import malloc
malloc.reexec_with_tcmalloc()
print("malloc", malloc.active(), os.environ.get("LD_PRELOAD", ""), flush=True)
"""

needs_tcmalloc = pytest.mark.skipif(ctypes.util.find_library(malloc.LIBRARY) is None,
                                    reason="libtcmalloc-minimal4 is not installed (make prereqs installs it)")


def run(**env: str) -> tuple[subprocess.Popen, list[list[str]]]:
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", malloc.SWITCH)}
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True,
                            env={**base, **env})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return proc, [line.split() for line in out.splitlines()]


@needs_tcmalloc
def test_the_process_execs_itself_once_under_tcmalloc_keeping_its_pid() -> None:
    proc, lines = run()
    assert [line[0] for line in lines] == ["start", "start", "malloc"]
    assert lines[0][1] == lines[1][1] == str(proc.pid)  # exec, not a child: a container's PID 1 stays PID 1
    assert lines[2][1] == "tcmalloc" and "tcmalloc" in lines[2][2]


@needs_tcmalloc
def test_switched_off_it_stays_on_the_system_malloc() -> None:
    _, lines = run(**{malloc.SWITCH: "0"})
    assert [line[0] for line in lines] == ["start", "malloc"]
    assert lines[1][1:] == ["system"]


@needs_tcmalloc
def test_an_existing_preload_of_tcmalloc_is_kept_and_not_execed_again() -> None:
    library = ctypes.util.find_library(malloc.LIBRARY)
    _, lines = run(LD_PRELOAD=library)
    assert [line[0] for line in lines] == ["start", "malloc"]
    assert lines[1][1:] == ["tcmalloc", library]


@needs_tcmalloc
def test_other_preloads_are_kept_beside_it() -> None:
    other = "libm.so.6"  # any library the loader finds; it changes nothing
    _, lines = run(LD_PRELOAD=other)
    assert [line[0] for line in lines] == ["start", "start", "malloc"]
    assert lines[2][1] == "tcmalloc" and lines[2][2].split(":")[1:] == [other]


def test_without_the_library_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(malloc.SWITCH, raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("exec without a library"))
    malloc.reexec_with_tcmalloc()
    assert "LD_PRELOAD" not in os.environ

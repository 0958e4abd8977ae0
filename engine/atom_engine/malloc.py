"""tcmalloc under the engine's process, where the system has it.

Each eager decode step makes and drops about a thousand small tensors, and each prefill a few large ones; glibc's
malloc serves them slower than tcmalloc (Debian's ``libtcmalloc-minimal4``; the gain is in
benchmarks/results/measured-in-place.md). Raising glibc's mmap and trim thresholds (``mallopt``) did not get it.
vLLM's CPU backend preloads tcmalloc for its engine processes the same way (vllm/platforms/cpu.py) and its docs
ask for it.

A preload takes effect only from a process's start, so the entry point (:func:`reexec_with_tcmalloc`, before
torch is imported) replaces the process once with itself under ``LD_PRELOAD``: ``exec`` keeps the PID, so a
container's PID 1 stays PID 1 and its signals still reach the server. ``ATOM_ENGINE_TCMALLOC=0`` turns it off; a
process whose ``LD_PRELOAD`` already names tcmalloc is left as it is (that is also what stops a second exec); where
the library is not installed, nothing changes and the engine runs on glibc's malloc.
"""

from __future__ import annotations

import ctypes.util
import os
import sys

SWITCH = "ATOM_ENGINE_TCMALLOC"  # "0": stay on the system's malloc
LIBRARY = "tcmalloc_minimal"  # Debian/Ubuntu: libtcmalloc-minimal4, the allocator without the heap profiler


def reexec_with_tcmalloc() -> None:
    """Replace this process with itself under ``LD_PRELOAD=<tcmalloc>`` unless switched off, already preloaded,
    or not installed. Returns only when it does not exec."""
    preload = os.environ.get("LD_PRELOAD", "")
    if os.environ.get(SWITCH, "1") == "0" or not sys.platform.startswith("linux") or "tcmalloc" in preload:
        return
    library = ctypes.util.find_library(LIBRARY)  # a soname from the linker cache, which the loader resolves
    if library is None:
        return
    os.environ["LD_PRELOAD"] = f"{library}:{preload}" if preload else library
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def active() -> str:
    """Which malloc serves this process: ``tcmalloc`` when its library is mapped, else ``system``."""
    try:
        with open("/proc/self/maps") as maps:
            return "tcmalloc" if any("libtcmalloc" in line for line in maps) else "system"
    except OSError:
        return "system"

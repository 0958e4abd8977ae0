"""``atom-engine serve --role standalone|decode|prefill --config FILE [--host --port]`` and
``atom-engine compile --config FILE`` (build the compiled artifact under compileCacheDir, or verify it).

Settings are read and checked before anything heavy is imported: bad settings stop the process with the
rule's message (the admission webhook's words) and exit status 2, before the model loads. An artifact under
compileCacheDir that disagrees with the settings stops it with exit status 3, its message also written to the
kubelet's termination log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

EXIT_BAD_SETTINGS = 2
EXIT_ARTIFACT_MISMATCH = 3
TERMINATION_LOG = Path("/dev/termination-log")  # the kubelet's default terminationMessagePath


class _KeyValueFormatter(logging.Formatter):
    """One event per line: ``ts=... level=... logger=... event=... key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        msg = record.getMessage()
        if not msg.startswith("event="):
            msg = f"event=log message={json.dumps(msg)}"
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} {msg}"
        if record.exc_info:
            line += " exception=" + json.dumps(self.formatException(record.exc_info))
        return line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="atom-engine", description="The Atom serving engine.")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one role over HTTP")
    serve.add_argument("--role", choices=["standalone", "decode", "prefill"], required=True)
    serve.add_argument("--config", required=True, help="engine settings YAML (camelCase keys)")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--metrics-port", type=int, default=None,
                       help="also serve /metrics alone on this port (it is always on --port too)")
    serve.add_argument("--log-level", default="info")
    comp = sub.add_parser("compile", help="build the compiled artifact under compileCacheDir, or verify it")
    comp.add_argument("--config", required=True, help="engine settings YAML (camelCase keys)")
    comp.add_argument("--log-level", default="info")
    comp.set_defaults(role=None)  # any role's graphs: an rngd prefill artifact too
    return p


def _refuse_artifact(exc: Exception) -> int:
    print(f"atom-engine: {exc}", file=sys.stderr)
    if TERMINATION_LOG.is_file() and os.access(TERMINATION_LOG, os.W_OK):
        TERMINATION_LOG.write_text(f"{exc}\n")
    return EXIT_ARTIFACT_MISMATCH


def _compile(settings) -> int:  # noqa: ANN001 - EngineSettings, imported lazily
    """Build the artifact, or verify an existing one, and exit."""
    from atom_engine import artifacts

    log = logging.getLogger("atom_engine")
    artifact = artifacts.locate(settings)  # ArtifactMismatch: handled by the caller
    if artifact.manifest is not None:
        artifacts.verify_files(artifact)
        log.info("event=artifact_verified key=%s path=%s", artifact.key, artifact.path)
        return 0
    from atom_engine import cpu_allowance

    cpu_allowance.apply(settings.cpu_threads)  # before torch loads: OpenMP reads its wait policy then
    from atom_engine.model.loader import load_model
    from atom_engine.runner import ModelRunner

    model, _ = load_model(settings.model_source, max_seq_len=settings.max_seq_len, dtype=settings.dtype,
                          seed=settings.seed)
    ModelRunner(model, settings)  # compiles and saves (event=artifact_compiled)
    return 0


def _load_settings(path: str, role: str | None):  # noqa: ANN202 - EngineSettings, imported lazily
    from atom_engine.limits import role_backend_error
    from atom_engine.settings import EngineSettings

    settings = EngineSettings.load(path)
    if role is not None and (error := role_backend_error(role, settings.backend)):
        raise ValueError(error)
    # localPrefill: false without prefillWorkers is refused by the settings themselves (limits.py's
    # remote-prefill-needs-worker rule, the same the webhook and the CRD apply).
    return settings


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValueFormatter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    try:
        settings = _load_settings(args.config, args.role)
    except ValidationError as exc:
        msgs = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        print(f"atom-engine: bad settings in {args.config}: {msgs}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except (OSError, ValueError) as exc:
        print(f"atom-engine: bad settings in {args.config}: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    from atom_engine.artifacts import ArtifactMismatch, locate

    if args.command == "compile" and not settings.compile_cache_dir:
        print(f"atom-engine: bad settings in {args.config}: compile needs compileCacheDir", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    try:
        if args.command == "compile":
            return _compile(settings)
        if settings.compile_cache_dir:
            locate(settings)  # refuse a mismatching artifact before the model loads
    except ArtifactMismatch as exc:
        return _refuse_artifact(exc)
    import asyncio

    from atom_engine import cpu_allowance

    # Before torch loads (OpenMP reads its wait policy then) and the model (its packing runs on these threads).
    cpu = cpu_allowance.apply(settings.cpu_threads)
    from atom_engine.malloc import active
    from atom_engine.server.app import serve

    logging.getLogger("atom_engine").info("event=starting role=%s config=%s malloc=%s", args.role, args.config,
                                          active())
    # The choice made here, once, is what /metrics shows (atom:cpu_threads_info): the server never re-decides.
    asyncio.run(serve(settings, args.role, args.host, args.port, args.metrics_port, cpu))
    return 0


def entrypoint() -> None:
    """The process's entry (the console script, ``python -m``), not :func:`main`'s (tests call that in process):
    first the process re-executes itself once under tcmalloc where the system has it (:mod:`atom_engine.malloc`)."""
    from atom_engine.malloc import reexec_with_tcmalloc

    reexec_with_tcmalloc()
    exit_process(main())


def exit_process(code: int) -> NoReturn:
    """End the process without finalizing the interpreter. The server has closed what it owns by now; a daemon
    thread (the compute thread, a step that never returned) still inside a torch call when finalization starts is
    ended in a C++ destructor and aborts the process (``terminate called without an active exception``), turning
    a clean stop into a crash. So flush the logs and streams, then leave."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    entrypoint()

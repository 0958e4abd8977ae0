"""``atom-engine serve --role standalone|decode|prefill --config FILE [--host --port]``.

Settings are read and checked before anything heavy is imported: bad settings stop the process with the
rule's message (the admission webhook's words) and exit status 2, before the model loads.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from pydantic import ValidationError

EXIT_BAD_SETTINGS = 2


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
    return p


def _load_settings(path: str, role: str):  # noqa: ANN202 - EngineSettings, imported lazily
    from atom_engine.settings import EngineSettings

    settings = EngineSettings.load(path)
    if role == "decode" and not settings.local_prefill and not settings.prefill_workers:
        raise ValueError("--role decode with localPrefill: false needs prefillWorkers (host:port)")
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
    import asyncio

    from atom_engine.server.app import serve

    logging.getLogger("atom_engine").info("event=starting role=%s config=%s", args.role, args.config)
    asyncio.run(serve(settings, args.role, args.host, args.port, args.metrics_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The images of ``make bench-autoscale``: the operator and the engine built from the committed tree (``git archive
HEAD``, so uncommitted work in the checkout does not leak into the benchmark), and a bench-only image FROM the
engine that runs ``python -m tests.pacing`` in place of ``atom-engine`` (the operator's pods run the command
``atom-engine serve ...``; the paced runner is a stand-in added on top, never in the engine's request path).

    python -m benchmarks.autoscale_images          # prints the three tags
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from atom_localcluster.images.base import choose_base
from atom_localcluster.images.daemon import DockerError, cache_dir, ensure_daemon, log, tail
from atom_localcluster.images.wheels import serve_wheels, wheelhouse

REPO = Path(__file__).resolve().parents[1]
OPERATOR_TAG = "atom-operator:bench-autoscale"
ENGINE_TAG = "atom-engine:bench-autoscale"
PACED_TAG = "atom-engine-paced:bench-autoscale"
COMMIT_LABEL = "dev.atom.bench.commit"  # the commit an image was built from (git archive HEAD at build time)

# Decode 50 ms a step (20 tokens/s a lane), prefill 2 ms a prompt token: the capacities the pacing arithmetic uses
# (shared/autoscaling-design.md 8.3). Both are set in the one image: a decode pod with remote prefill never runs a
# prefill chunk, a prefill worker never runs a decode step.
PACE_PREFILL_MS_PER_TOKEN = 2.0
PACE_DECODE_STEP_MS = 50.0

PACED_DOCKERFILE = f"""\
FROM {ENGINE_TAG}
COPY tests/__init__.py /opt/bench/tests/__init__.py
COPY tests/pacing.py /opt/bench/tests/pacing.py
ENV ATOM_TEST_PACE_PREFILL_MS_PER_TOKEN={PACE_PREFILL_MS_PER_TOKEN} \\
    ATOM_TEST_PACE_DECODE_STEP_MS={PACE_DECODE_STEP_MS}
USER 0
# The operator's command is `atom-engine serve ...`: the same name, now the paced runner in front of the engine.
RUN printf '#!/bin/sh\\nexport PYTHONPATH=/opt/bench\\nexec python -m tests.pacing "$@"\\n' \\
      > /usr/local/bin/atom-engine-paced && chmod 755 /usr/local/bin/atom-engine-paced \\
 && ln -sf /usr/local/bin/atom-engine-paced /opt/atom/bin/atom-engine
USER 10001:10001
"""


@contextlib.contextmanager
def committed_tree() -> Iterator[Path]:
    """HEAD's files in a temporary folder (git archive reads objects only; the index is not touched)."""
    with tempfile.TemporaryDirectory(prefix="atom-bench-autoscale-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def _docker_build(args: list[str], logname: str, stdin: bytes | None = None) -> float:
    logfile = cache_dir() / "docker" / f"build-{logname}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(logfile, "wb") as out:
        rc = subprocess.run(["docker", "build", *args], input=stdin, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise DockerError(f"docker build {logname} exited {rc}; {logfile}:\n{tail(logfile, 40)}")
    return time.monotonic() - began


def user_of(tag: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "-f", "{{.Config.User}}", tag], capture_output=True, text=True, check=True
    ).stdout.strip()


def commit_of(tag: str) -> str:
    out = subprocess.run(
        ["docker", "inspect", "-f", f'{{{{index .Config.Labels "{COMMIT_LABEL}"}}}}', tag],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() not in ("", "<no value>") else "unknown"


def build_all() -> dict[str, str]:
    ensure_daemon()
    base = choose_base(None)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    label = ["--label", f"{COMMIT_LABEL}={commit}"]
    with committed_tree() as tree:
        for target, tag in (("operator", OPERATOR_TAG), ("engine", ENGINE_TAG)):
            with serve_wheels(wheelhouse(target)) as url:
                s = _docker_build(
                    [
                        "--file",
                        str(tree / "Dockerfile"),
                        "--target",
                        target,
                        "--tag",
                        tag,
                        "--network",
                        "host",
                        *label,
                        "--build-arg",
                        f"WHEELS_URL={url}",
                        "--build-arg",
                        f"BASE_IMAGE={base}",
                        str(tree),
                    ],
                    f"bench-autoscale-{target}",
                )
            log(f"built {tag} in {s:.0f}s")
        engine_user = user_of(ENGINE_TAG) or "0"
        text = PACED_DOCKERFILE.replace("USER 10001:10001", f"USER {engine_user}")
        # A context of its own: the repository's .dockerignore leaves tests/ out.
        context = tree / "build" / "paced-context"
        (context / "tests").mkdir(parents=True)
        (context / "tests" / "__init__.py").write_text("")
        (context / "tests" / "pacing.py").write_text((tree / "tests" / "pacing.py").read_text())
        s = _docker_build(
            ["--file", "-", "--tag", PACED_TAG, *label, str(context)], "bench-autoscale-paced", text.encode()
        )
        log(f"built {PACED_TAG} in {s:.0f}s")
    return {"operator": OPERATOR_TAG, "engine": ENGINE_TAG, "paced": PACED_TAG}


if __name__ == "__main__":
    print(build_all())
    sys.exit(0)

"""The ArtifactReady report from compile Jobs and their pods, without a cluster."""

from __future__ import annotations

from atom_operator.children import build_children
from atom_operator.children.meta import ARTIFACT_KEY
from atom_operator.compile_jobs import JobView, failure_of, report

from tests.operator.test_children import CACHE, DEFAULTS, owner

MISMATCH = "atom-engine: artifact mismatch: lanes: artifact has 2, settings have 4"


def failed_pod(message: str, code: int = 3) -> dict:
    terminated = {"exitCode": code, "reason": "Error", "message": message}
    return {
        "status": {"phase": "Failed", "containerStatuses": [{"name": "engine", "state": {"terminated": terminated}}]}
    }


def job(key: str, state: str) -> dict:
    conditions = {
        "Succeeded": [{"type": "Complete", "status": "True"}],
        "Failed": [{"type": "Failed", "status": "True", "message": "Container engine failed with exit code 3"}],
        "Running": [],
    }
    return {"metadata": {"annotations": {ARTIFACT_KEY: key}}, "status": {"conditions": conditions[state]}}


def test_the_mismatch_line_is_found_in_the_log_tail_and_other_failures_keep_their_exit_code() -> None:
    assert failure_of(failed_pod("loading\n" + MISMATCH + "\n")) == MISMATCH.removeprefix("atom-engine: ")
    assert failure_of(failed_pod("Traceback ...\nMemoryError", 1)) == "exit code 1 (Error): MemoryError"
    assert failure_of({"status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 0}}}]}}) is None


def test_the_report_follows_the_job_of_the_current_key() -> None:
    o = owner(model={"source": "builtin:tiny", "compileCache": CACHE})
    wanted = build_children(o, DEFAULTS)
    key = wanted.desired[-1]["metadata"]["annotations"][ARTIFACT_KEY]
    assert report(o, wanted, {}, []).summary == "Compiling"
    assert report(o, wanted, {"llm-decode-build": JobView.of(job("old", "Succeeded"))}, []).summary == "Compiling"
    done = report(o, wanted, {"llm-decode-build": JobView.of(job(key, "Succeeded"))}, [])
    assert (done.summary, done.ready, done.reason) == ("Ready", True, "ArtifactsReady")
    failed = report(
        o,
        wanted,
        {"llm-decode-build": JobView.of(job(key, "Failed"))},
        [("decode-build", failure_of(failed_pod(MISMATCH)))],
    )
    assert (failed.summary, failed.reason) == ("Mismatch", "ArtifactMismatch")
    assert failed.message == (
        "decode: artifact mismatch: lanes: artifact has 2, settings have 4; the decode pods do not start"
        " (Job llm-decode-build)"
    )


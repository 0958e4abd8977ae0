"""What the compile Jobs of spec.model.compileCache tell: the ArtifactReady condition and the ARTIFACT column (pure).

A role's artifact is ready when the Job building its current key succeeded. A Job that fails reports the
message its pod left (``atom-engine compile`` writes an artifact mismatch to /dev/termination-log; any other
failure falls back to the log's tail): a mismatch names the field and both values, and the role's pods never
start, so no pod loads a mismatched artifact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from atom_operator.children import Children, Owner
from atom_operator.children.meta import ARTIFACT_KEY, ROLES, build_name

State = Literal["Running", "Succeeded", "Failed"]
MISMATCH = "artifact mismatch:"
MESSAGE_MAX = 1024


@dataclass(frozen=True)
class JobView:
    """What status needs of one compile Job."""

    key: str  # the artifact it builds (its annotation)
    state: State
    message: str  # the Job's own failure condition, when it failed

    @classmethod
    def of(cls, job: dict[str, Any]) -> JobView:
        status = job.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
        state: State = "Succeeded" if "Complete" in conditions else "Failed" if "Failed" in conditions else "Running"
        message = (conditions.get("Failed") or {}).get("message") or ""
        return cls((job["metadata"].get("annotations") or {}).get(ARTIFACT_KEY, ""), state, message)


def failure_of(pod: dict[str, Any]) -> str | None:
    """The message a failed container left: its termination message (or, with FallbackToLogsOnError, its log's
    tail), the line naming an artifact mismatch when there is one."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        done = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if not done or not done.get("exitCode"):
            continue
        text = (done.get("message") or "").strip()
        line = next((ln.strip() for ln in text.splitlines() if MISMATCH in ln), None)
        if line:
            return line[line.index(MISMATCH) :][:MESSAGE_MAX]
        tail = text.splitlines()[-1] if text else ""
        return f"exit code {done['exitCode']} ({done.get('reason') or 'Error'}){': ' + tail if tail else ''}"[
            :MESSAGE_MAX
        ]
    return None


@dataclass(frozen=True)
class Report:
    summary: Literal["Compiling", "Ready", "Failed", "Mismatch"]
    reason: str
    message: str

    @property
    def ready(self) -> bool:
        return self.summary == "Ready"


def report(owner: Owner, wanted: Children, jobs: Mapping[str, JobView], failures: Iterable[tuple[str, str]]) -> Report:
    """``failures``: (component, message) of the failed compile pods seen, e.g. ("decode-build", "artifact ...")."""
    keys = {
        c["metadata"]["name"]: c["metadata"]["annotations"][ARTIFACT_KEY] for c in wanted.desired if c["kind"] == "Job"
    }
    failed = dict(failures)
    ready, compiling, broken = [], [], []
    for role in ROLES:
        name = build_name(owner, role)
        if name not in keys:
            continue
        job = jobs.get(name)
        if job is None or job.key != keys[name] or job.state == "Running":
            compiling.append(f"{role}: compile Job {name} running")
        elif job.state == "Succeeded":
            ready.append(f"{role}: artifact {keys[name]} built by Job {name}")
        else:
            why = failed.get(f"{role}-build") or job.message or "failed"
            broken.append(f"{role}: {why}; the {role} pods do not start (Job {name})")
    if broken:
        mismatch = any(MISMATCH in b for b in broken)
        return Report(
            "Mismatch" if mismatch else "Failed",
            "ArtifactMismatch" if mismatch else "CompileFailed",
            "; ".join(broken + compiling),
        )
    if compiling:
        return Report("Compiling", "Compiling", "; ".join(compiling))
    return Report("Ready", "ArtifactsReady", "; ".join(ready))

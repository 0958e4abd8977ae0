"""One uid per image: each pod spec runs its image as the user that image's Dockerfile stage declares."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from atom_operator.children.inferencepool import EPP_UID
from atom_operator.children.workload import ENGINE_UID

REPO = Path(__file__).resolve().parents[2]


def stage_users() -> dict[str, str]:
    """The last ``USER`` of each ``FROM ... AS <stage>`` of the Dockerfile."""
    users, stage = {}, None
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if found := re.match(r"FROM \S+ AS (\S+)", line):
            stage = found.group(1)
        elif line.startswith("USER ") and stage:
            users[stage] = line.split()[1]
    return users


def test_each_pod_runs_as_its_images_user() -> None:
    users = stage_users()
    assert users["engine"] == users["engine-rngd"] == f"{ENGINE_UID}:{ENGINE_UID}"
    assert users["epp"] == f"{EPP_UID}:{EPP_UID}"
    chart = (REPO / "charts" / "atom-operator" / "templates" / "deployment.yaml").read_text()
    context = yaml.safe_load(re.search(r"securityContext:\n((?:        .*\n)+)", chart).group(1))
    assert users["operator"] == f"{context['runAsUser']}:{context['runAsGroup']}"

"""Every file in examples/ is what a user applies: each one, applied with kubectl exactly as the README says,
is admitted and becomes READY on the harness (kwok's pods turn Ready as the scheduler places them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_kubectl_apply_of_an_example_becomes_ready(cluster, op, namespace, example: Path) -> None:
    name = yaml.safe_load(example.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", str(example))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"atomdeployment/{name}", "--timeout=120s",
                    timeout=130)
    row = cluster.kubectl("get", "atomdeployments", "-n", namespace, name, "--no-headers").stdout
    assert row.split()[:2] == [name, "True"], row  # NAME, READY (the printer columns kubectl shows)

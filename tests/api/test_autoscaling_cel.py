"""The autoscaling rules' CEL against their Python, on the real API server: random bounds, bands and budgets
(the search over decode counts in CEL is the part a table of hand-picked cases could miss)."""

from __future__ import annotations

import json
import os
import random

import pytest
from atom_operator.api import problems

from tests.api.cases import spec

pytestmark = pytest.mark.cluster
CASES = 80


def _random_spec(rng: random.Random) -> dict:
    dmin = rng.randint(1, 6)
    pmin = rng.randint(0, 4)
    auto: dict = {
        "mode": "Operator",
        "decode": {"minReplicas": dmin, "maxReplicas": max(1, dmin + rng.randint(-1, 5))},  # schema-valid: rules only
        "prefill": {"minReplicas": pmin, "maxReplicas": max(1, pmin + rng.randint(-1, 4))},
        "ratio": {
            "min": {"prefill": rng.randint(1, 6), "decode": rng.randint(1, 16)},
            "max": {"prefill": rng.randint(1, 6), "decode": rng.randint(1, 6)},
        },
    }
    if rng.random() < 0.6:
        auto["npuBudget"] = rng.randint(0, 30)
    decode = {"npusPerReplica": rng.randint(1, 3)}
    return spec(decode, {"npusPerReplica": rng.randint(1, 3)}, autoscaling=auto)


def test_random_autoscaling_specs_are_judged_alike(crds) -> None:
    # A namespace of its own, without the webhook (the module-scoped crd_ns is named by the process alone).
    crd_ns = f"api-autoscaling-cel-{os.getpid()}"
    crds.kubectl("create", "namespace", crd_ns)
    rng = random.Random(33)
    judged = {"accepted": 0, "refused": 0}
    for i in range(CASES):
        s = _random_spec(rng)
        obj = {"apiVersion": "serving.atom.dev/v1alpha1", "kind": "AtomDeployment",
               "metadata": {"name": f"rand-{i}", "namespace": crd_ns}, "spec": s}  # fmt: skip
        expected = [p.message for p in problems(obj)]
        out = crds.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
        assert (out.returncode == 0) == (not expected), (s, expected, out.stderr)
        for message in expected:
            assert message in out.stderr, (s, message, out.stderr)
        judged["refused" if expected else "accepted"] += 1
    crds.kubectl("delete", "namespace", crd_ns, "--wait=false", check=False)
    # The draw exercises both answers, or the comparison proves little.
    assert judged["accepted"] >= 10 and judged["refused"] >= 10, judged

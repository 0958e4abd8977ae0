"""Prefix-aware routing across two decode replicas: the Gateway API Inference Extension's endpoint picker (EPP)
through Envoy against Envoy's random pick (a Service) and GIE's round-robin lwepp through the same Envoy, on fresh
engines each.

The decode pods are an AtomDeployment's, scheduled on kwok nodes; their engines run here as the pod specs say, on
loopback addresses patched in as the pods' IPs (atom_localcluster/routing/stack.py says why). The speed goal (TTFT
p90) is ``make bench-routing``'s; this test checks what routing decides: where the prefixes land, read from the
engines' own prefix-cache counters.
"""

from __future__ import annotations

import pytest
from atom_localcluster.routing import scenario
from atom_localcluster.routing.workload import Workload

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_the_endpoint_picker_keeps_each_prefix_on_one_replica(cluster, operator_process, namespace,  # noqa: ANN001
                                                              tmp_path) -> None:
    scenario.install_crds(cluster)
    scenario.deploy(cluster, namespace, "smollm2")
    w = Workload()
    results = {router: scenario.one_run(router, cluster, namespace, "smollm2", w, tmp_path, router)
               for router in scenario.ROUTERS}
    shown = {r: f"{x.hit_rate:.3f} ({x.requests_per_pod})" for r, x in results.items()}
    for r, x in results.items():  # the figures, for the log (-s); the speed goal is bench-routing's
        print(f"{r}: hit rate {x.hit_rate:.3f}, TTFT p50 {x.ttft_p50 * 1e3:.0f} ms p90 {x.ttft_p90 * 1e3:.0f} ms,"
              f" requests per pod {x.requests_per_pod}, {x.seconds:.0f} s")
    epp, random, lwepp = (results[r].hit_rate for r in scenario.ROUTERS)
    assert all(min(x.requests_per_pod) > 0 for x in results.values()), f"a replica got nothing: {shown}"
    assert epp >= 0.8, f"prefix hit rate through the EPP: {shown}"
    assert epp >= random + 0.3 and epp >= lwepp + 0.3, f"prefix hit rates: {shown}"

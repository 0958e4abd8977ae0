"""Prefix-aware routing on the local cluster: decode engines behind Envoy and a router (the stack), the
shared-prefix workload, and the three-way scenario that the test (tests/routing) and ``make bench-routing`` run."""

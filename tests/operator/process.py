"""The session's operator process: the local cluster's, also serving the API tests' probe CRD."""

from __future__ import annotations

from atom_localcluster import operator


class OperatorProcess(operator.OperatorProcess):
    # The probe serves the API tests' schemaless CRD copy (tests/api/probe.py).
    modules = (*operator.OperatorProcess.modules, "tests.api.probe")

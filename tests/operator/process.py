"""The session's operator process: the local cluster's, also serving the API tests' probe CRD and, when a test
asks for one, the crash failpoint (tests/operator/failpoint.py)."""

from __future__ import annotations

from atom_localcluster import operator

from tests.operator import failpoint


class OperatorProcess(operator.OperatorProcess):
    # The probe serves the API tests' schemaless CRD copy (tests/api/probe.py).
    modules = (*operator.OperatorProcess.modules, "tests.api.probe")

    def start(self, wait: bool = True, **env: str) -> None:
        """``ATOM_FAILPOINT=...`` in ``env`` also loads the test hook that acts on it."""
        asked = (failpoint.__name__,) if env.get(failpoint.ENV) else ()
        self.modules = (*type(self).modules, *asked)
        super().start(wait, **env)

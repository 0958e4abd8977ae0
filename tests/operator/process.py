"""The session's operator process: the local cluster's, with the crash failpoint (tests/operator/failpoint.py) when
a test asks for one."""

from __future__ import annotations

from atom_localcluster import operator

from tests.operator import failpoint


class OperatorProcess(operator.OperatorProcess):
    def start(self, wait: bool = True, **env: str) -> None:
        """``ATOM_FAILPOINT=...`` in ``env`` also loads the test hook that acts on it."""
        self.hooks = (failpoint.__name__,) if env.get(failpoint.ENV) else ()
        super().start(wait, **env)

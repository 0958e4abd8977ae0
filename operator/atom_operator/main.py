"""The operator's process: settings from the environment, the runtime started, and stopped on SIGTERM or SIGINT.

No framework: the informers (:mod:`atom_operator.informer`), the work queue (:mod:`atom_operator.controller`), the
admission webhook (:mod:`atom_operator.webhook`) and leader election (:mod:`atom_operator.lease`) are the
project's own, composed in :mod:`atom_operator.runtime`.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from atom_operator import runtime
from atom_operator.config import Settings

log = logging.getLogger(__name__)
EXIT_LEASE_LOST = 3  # the kubelet restarts the container, which stands by until it may lead again


async def run(settings: Settings) -> int:
    """Run until a signal to stop (0) or the loss of the Lease (:data:`EXIT_LEASE_LOST`)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    parts = await runtime.start(settings)
    log.info("event=started namespaces=%s", ",".join(settings.namespaces) or "*")
    signalled, lost = asyncio.create_task(stopping.wait()), asyncio.create_task(parts.lost.wait())
    await asyncio.wait([signalled, lost], return_when=asyncio.FIRST_COMPLETED)
    for t in (signalled, lost):
        t.cancel()
    await parts.stop()
    log.info("event=stopped lease_lost=%s", parts.lost.is_set())
    return EXIT_LEASE_LOST if parts.lost.is_set() else 0


def main(verbose: bool = False) -> int:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # The client library logs every request at DEBUG; --verbose is about the operator.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.INFO)
    return asyncio.run(run(Settings.from_env()))

"""The KV connector an engine's settings ask for, built by the engine (vLLM's ``KVConnectorFactory``): remote-only
PD (``localPrefill: false``) or selective PD (``localPrefill: true`` with ``prefillWorkers``).

The serving layer owns the network: it starts the prefill pool's client on its event loop and hands the engine a
:class:`PrefillPool`. The engine builds its connector from its settings with it, and binds the connector to its KV
blocks and model once they are loaded (``KVConnector.bind``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from atom_engine.kv_blocks import SourceSlots
from atom_engine.kv_connector import KVConnector
from atom_engine.pd.remote import RemoteConnector, RemotePrefill
from atom_engine.pd.selective import SelectiveConnector
from atom_engine.settings import EngineSettings


@dataclass(frozen=True)
class PrefillPool:
    """How an engine reaches the prefill workers: a started client (``fetch``, its ``breaker``; a wrapper that
    times fetches will do) and the event loop its fetches run on."""

    client: Any
    loop: asyncio.AbstractEventLoop


def build_connector(settings: EngineSettings, pool: PrefillPool) -> KVConnector:
    # One staging slot per lane: each lane waits for at most one shipment (B1 prefetch has one lane).
    remote = RemoteConnector(RemotePrefill(pool.client, pool.loop), slots=SourceSlots(settings.lanes),
                             prefetch_next=settings.prefetch_next)
    if not settings.local_prefill:
        return remote
    return SelectiveConnector(remote, pool.client.breaker, min_tokens=settings.remote_prefill_min_tokens)

"""What a backend can do, declared by the backend and read by name: the runner, the batcher and the server ask
:class:`Capabilities`, never probe a backend's attributes. Torch-free.

A caller that needs what the backend lacks gets :class:`MissingCapability`, naming the backend and the
capability, instead of an ``AttributeError`` from deep inside a step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Capabilities:
    every_token_logits: bool = False  # prefill returns every token's logits (prompt logprobs), not only the last
    verify: bool = False  # decode takes several tokens per lane (speculative drafts)
    mixed: bool = False  # a decode step may carry prefill chunks in the same forward
    decode: bool = True  # runs the decode graph at all (rngd compiles prefill only)
    kv_transfer: bool = True  # export_kv / import_kv (PD)
    devices: int = 0  # accelerator devices driven (0: runs on the host)

    def require(self, backend: str, name: str, why: str) -> None:
        """Raise :class:`MissingCapability` unless the capability ``name`` is there."""
        if name not in {f.name for f in fields(self)}:
            raise ValueError(f"no capability named {name!r}")
        if not getattr(self, name):
            raise MissingCapability(backend, name, why)


class MissingCapability(RuntimeError):
    """A backend was asked for what it does not declare."""

    def __init__(self, backend: str, capability: str, why: str) -> None:
        super().__init__(f"{why}: the {backend} backend lacks the {capability!r} capability")
        self.backend, self.capability = backend, capability

"""Which ATOM cards this engine drives, and whether the model fits on them.

The device list follows vllm-rbln (vllm_rbln/v1/worker/utils.py:186-315, vllm_rbln/platform/__init__.py:100):
``RBLN_VISIBLE_DEVICES`` names the cards when set (the deprecated ``RBLN_DEVICES`` is folded into it), else the
``/dev/rbln<N>`` nodes the device plugin gave the container, else ``0..n-1``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import MutableMapping
from pathlib import Path

from atom_engine import limits

log = logging.getLogger("atom_engine.devices")
DEVICE_NODE = re.compile(r"rbln(\d+)")


def adopt_deprecated_env(env: MutableMapping[str, str]) -> None:
    """Fold the deprecated ``RBLN_DEVICES`` into ``RBLN_VISIBLE_DEVICES`` and unset it, as vllm-rbln does
    (vllm_rbln/platform/__init__.py:259-277): the runtime prefers ``RBLN_DEVICES`` when both are set, so one left
    behind would put the runtime on other cards than the ones this engine chose."""
    legacy = env.pop("RBLN_DEVICES", None)
    if legacy is not None:
        in_effect = env.setdefault("RBLN_VISIBLE_DEVICES", legacy)
        log.warning("event=deprecated_env name=RBLN_DEVICES use=RBLN_VISIBLE_DEVICES in_effect=%s", in_effect)


def visible_devices(num_devices: int, env: MutableMapping[str, str] | None = None, dev_dir: str | Path = "/dev"
                    ) -> list[int]:
    """The first ``num_devices`` visible cards; ValueError naming the count and the source when fewer are
    visible. Logs one ``event=atom_devices`` line."""
    env = os.environ if env is None else env
    adopt_deprecated_env(env)
    found: list[int] | None = None
    source = ""
    raw = env.get("RBLN_VISIBLE_DEVICES", "")
    if raw.strip():
        try:
            found = [int(t) for t in raw.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"RBLN_VISIBLE_DEVICES={raw!r}: expected card numbers separated by commas") from None
        source = "RBLN_VISIBLE_DEVICES"
    if found is None:
        try:
            nodes = sorted(int(m.group(1)) for p in Path(dev_dir).iterdir() if (m := DEVICE_NODE.fullmatch(p.name)))
        except OSError:
            nodes = []
        if nodes:
            found, source = nodes, f"{dev_dir}/rbln*"
        else:
            found, source = list(range(num_devices)), "default"
    if len(found) < num_devices:
        raise ValueError(f"numDevices is {num_devices} but only {len(found)} ATOM device(s) are visible"
                         f" ({source}: {found}); give the pod {num_devices} NPUs or lower npusPerReplica")
    devices = found[:num_devices]
    log.info("event=atom_devices num_devices=%d devices=%s source=%s visible=%s", num_devices,
             ",".join(map(str, devices)), source, ",".join(map(str, found)))
    return devices


def check_fits(weight_bytes: int, kv_bytes: int, num_devices: int) -> None:
    """Refuse at start a model whose weights (held once) and KV cache exceed the devices' DRAM."""
    per = limits.ATOM_DRAM_BYTES - limits.ATOM_SYSTEM_BYTES
    need, available = weight_bytes + kv_bytes, num_devices * per
    if need > available:
        raise ValueError(
            f"the model does not fit on {num_devices} ATOM device(s): weights {weight_bytes} bytes + KV cache"
            f" {kv_bytes} bytes = {need} bytes needed; {available} bytes available ({num_devices} x {per}: 16 GiB"
            " per ATOM less its system region); lower kvBlocks or maxSeqLen, or raise npusPerReplica")

"""Which ATOM cards this engine drives, and whether the model fits on them.

The device list follows vllm-rbln (vllm_rbln/v1/worker/utils.py:186-315, vllm_rbln/platform/__init__.py:100):
``RBLN_VISIBLE_DEVICES`` names the cards when set (the deprecated ``RBLN_DEVICES`` is still read, as the runtime
does), else the ``/dev/rbln<N>`` nodes the device plugin gave the container, else ``0..n-1``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from atom_engine import limits

log = logging.getLogger("atom_engine.devices")
DEVICE_NODE = re.compile(r"rbln(\d+)")


def visible_devices(num_devices: int, env: Mapping[str, str] | None = None, dev_dir: str | Path = "/dev"
                    ) -> list[int]:
    """The first ``num_devices`` visible cards; ValueError naming the count and the source when fewer are
    visible. Logs one ``event=atom_devices`` line."""
    env = os.environ if env is None else env
    found: list[int] | None = None
    source = ""
    for var in ("RBLN_VISIBLE_DEVICES", "RBLN_DEVICES"):
        raw = env.get(var, "")
        if raw.strip():
            try:
                found = [int(t) for t in raw.replace(",", " ").split()]
            except ValueError:
                raise ValueError(f"{var}={raw!r}: expected card numbers separated by commas") from None
            source = var
            break
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

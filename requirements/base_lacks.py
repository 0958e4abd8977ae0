"""Print the pins of a requirements lock that the image's base does not already provide.

On an SDK base (``ENGINE_BASE_IMAGE``, e.g. a Rebellions RBLN SDK image) the base's Python carries the vendor SDK
and the torch it was built with (optimum-rbln 0.12.0 pins ``torch==2.13.0+cpu``); the engine's venv is created with
``--system-site-packages`` and must import those, so a package the base has is not installed again, and neither is
torch's CUDA stack when the base brings its own torch. On a plain base nothing is dropped. Run it with the venv's
Python before anything is installed there; stdlib only. The venv's own packaging tools never count as the base's.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

PACKAGING = {"pip", "setuptools", "wheel"}
TORCH_STACK = ("nvidia-", "cuda-", "triton")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_packages() -> dict[str, str]:
    venv = Path(sys.prefix).resolve()
    found: dict[str, str] = {}
    for dist in md.distributions():
        where = Path(str(dist.locate_file(""))).resolve()
        if where == venv or venv in where.parents:
            continue  # the venv's own (pip, setuptools)
        found.setdefault(normalize(dist.metadata["Name"]), dist.version)
    return found


def main(lock: str) -> int:
    base = base_packages()
    for line in Path(lock).read_text().splitlines():
        pin = line.strip()
        if not pin or pin.startswith("#"):
            continue
        name = normalize(re.split(r"[=<>!~;\[ ]", pin, maxsplit=1)[0])
        if name not in PACKAGING and (name in base or ("torch" in base and name.startswith(TORCH_STACK))):
            print(f"base_lacks: {pin} left out: the base has {name} {base.get(name, '(torch stack)')}",
                  file=sys.stderr)
            continue
        print(pin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

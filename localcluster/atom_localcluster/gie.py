"""The Gateway API Inference Extension (GIE) pieces the routing tests run, from the pinned Go modules.

* the endpoint pickers: ``epp`` (v1.5.0, prefix-cache and load aware) and ``lwepp`` (v1.6.0, round robin), built by
  atom_localcluster/tools.py from hack/tools/epp and hack/tools/lwepp;
* the ``InferencePool`` CRD (``inference.networking.k8s.io/v1``), read from the pinned module in Go's module cache
  (``go mod download``), so the tests install exactly the CRD of the picker they run, and nothing is vendored.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from atom_localcluster import tools

POOL_CRD = "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
POOL_CRD_NAME = "inferencepools.inference.networking.k8s.io"


def module_dir() -> Path:
    """The pinned GIE module's source in Go's module cache (downloaded if missing)."""
    ts = tools.toolset_of("epp")
    out = subprocess.run(["go", "mod", "download", "-json", f"{ts.module}@{ts.version}"],
                         cwd=tools.GO_MODULES / ts.name, capture_output=True, text=True, check=True)
    return Path(json.loads(out.stdout)["Dir"])


def pool_crd() -> Path:
    return module_dir() / POOL_CRD


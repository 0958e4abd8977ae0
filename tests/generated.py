"""The committed files ``make crds`` generates (the Makefile's CRD_FILES and the reference page)."""

from pathlib import Path

from atom_operator.api.crd import CRD_NAME

REPO = Path(__file__).resolve().parents[1]
CRD_PATH = REPO / "crds" / f"{CRD_NAME}.yaml"
CHART_CRD_PATH = REPO / "charts" / "atom-operator" / "crds" / f"{CRD_NAME}.yaml"
REFERENCE_PATH = REPO / "docs" / "atomdeployment.md"

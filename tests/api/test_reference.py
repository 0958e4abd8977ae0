"""The committed AtomDeployment reference is the one generated from the CRD schema."""

from atom_operator.api import reference

from tests.generated import REFERENCE_PATH


def test_committed_reference_is_the_generated_one() -> None:
    assert REFERENCE_PATH.read_text() == reference.render(), "docs/atomdeployment.md is stale: make crds"


def test_reference_lists_every_rule_and_the_block_bounds() -> None:
    page = reference.render()
    assert "`spec.decode.kvBlocks` | integer | `8` | ≥ 2, ≤ 4096 |" in page
    assert "decode.kvBlocks must be >= decode.lanes + 2" in page
    assert "prefill.prefetchNext needs decode.lanes == 1" in page

"""The engine's backend table (limits.BACKEND_ROLES), from which the settings and the spec take their backend
names, is what make_backend builds: every name they admit reaches its backend, any other is refused."""

from __future__ import annotations

import pytest
from atom_engine import limits
from atom_engine.backends import make_backend
from atom_engine.model.loader import load_model

UNKNOWN = "backend must be one of"


@pytest.fixture(scope="module")
def model():  # noqa: ANN201
    return load_model("builtin:tiny", max_seq_len=64)[0]


@pytest.mark.parametrize("name", limits.BACKENDS)
def test_every_backend_the_settings_admit_is_one_make_backend_builds(name: str, model, rebel) -> None:  # noqa: ANN001
    # atom runs on the fake RBLN SDK; rngd needs furiosa-torch, which only the rngd venv has: there the backend
    # itself says so. Either way make_backend knew the name.
    try:
        backend = make_backend(name, model, lanes=1, kv_blocks=2, chunk=64)
    except RuntimeError as exc:
        assert name == "rngd" and "furiosa-torch" in str(exc)
    except ValueError as exc:
        assert not str(exc).startswith(UNKNOWN), exc
        raise
    else:
        assert type(backend).__name__.lower().startswith(name)


def test_make_backend_refuses_a_name_outside_the_table_and_names_the_table(model) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=UNKNOWN) as err:
        make_backend("tpu", model, lanes=1, kv_blocks=2, chunk=64)
    assert all(name in str(err.value) for name in limits.BACKENDS)


def test_the_roles_come_from_the_table() -> None:
    assert limits.DECODE_BACKENDS == ("atom", "cpu") and limits.PREFILL_BACKENDS == ("atom", "rngd", "cpu")
    assert limits.role_backend_error("decode", "rngd") and limits.role_backend_error("prefill", "rngd") is None

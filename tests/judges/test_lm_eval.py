"""lm-eval as an outside judge: its ``local-completions`` client (token-id prompts, batched; echo + logprobs for
loglikelihood, greedy generation with stop sequences) against the engine, directly and through PD, must score
exactly as lm-eval's own ``hf`` model on the same checkpoint, over the small task files in tasks/."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.judges.conftest import MODEL, TASKS, judge_env
from tests.serving.conftest import Proc

pytestmark = pytest.mark.judges


def test_lm_eval_scores_equal_hf_directly_and_through_pd(judges_python: Path, checkpoint: Path,
                                                         engines: dict[str, Proc], tmp_path: Path) -> None:
    out = tmp_path / "lm_eval.json"
    cmd = [str(judges_python), str(TASKS.parent / "lm_eval_driver.py"), "--checkpoint", str(checkpoint),
           "--model-name", MODEL, "--hf", "--engine", f"direct={engines['direct'].url}",
           "--engine", f"pd={engines['pd'].url}", "--out", str(out)]
    run = subprocess.run(cmd, cwd=TASKS, env=judge_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    res = json.loads(out.read_text())
    hf = res["hf"]
    assert len(hf["samples"]["atom_ll"]) == 8 and len(hf["samples"]["atom_gen"]) == 6
    assert 0.0 <= hf["results"]["atom_ll"]["acc,none"] <= 1.0
    for name in ("direct", "pd"):
        got = res[name]
        # Loglikelihoods: the same to float32 rounding (the engine's logits are not computed in HF's op order);
        # greediness and every metric exactly.
        for want, have in zip(hf["samples"]["atom_ll"], got["samples"]["atom_ll"], strict=True):
            assert want["doc_id"] == have["doc_id"]
            for (w_ll, w_greedy), (h_ll, h_greedy) in zip((r[0] for r in want["resps"]),
                                                          (r[0] for r in have["resps"]), strict=True):
                assert h_ll == pytest.approx(w_ll, abs=1e-3) and h_greedy == w_greedy, (name, want["doc_id"])
        # Generations: token-exact greedy, so the same text.
        assert [s["resps"] for s in got["samples"]["atom_gen"]] == [s["resps"] for s in hf["samples"]["atom_gen"]]
        assert got["results"] == hf["results"], name
    print(json.dumps({name: r["results"] for name, r in res.items()}, indent=1))

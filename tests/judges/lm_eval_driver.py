"""lm-eval over the task files in tasks/, for the hf model and for engines, in one process (one import of
lm-eval and torch). Runs in the judges' venv (hack/judges-venv.sh), started by test_lm_eval.py; run it from the
tasks directory (the task files name their data files relatively). Writes each model's metrics and per-sample
responses as JSON to --out."""

from __future__ import annotations

import argparse
import json

import lm_eval
from lm_eval.tasks import TaskManager

TASKS = ["atom_ll", "atom_gen"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True, help="HF checkpoint directory (the tokenizer, and the hf model)")
    ap.add_argument("--model-name", required=True, help="the engine's served model name")
    ap.add_argument("--engine", action="append", default=[], help="NAME=BASE_URL of an engine to evaluate")
    ap.add_argument("--hf", action="store_true", help="evaluate lm-eval's own hf model on the checkpoint too")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs: dict[str, tuple[str, str]] = {}
    if args.hf:
        runs["hf"] = ("hf", f"pretrained={args.checkpoint},dtype=float32,device=cpu")
    for spec in args.engine:
        name, url = spec.split("=", 1)
        # tokenized_requests: prompts go as token ids (lists of lists when batched), as lm-eval sends them to vLLM.
        runs[name] = ("local-completions", f"model={args.model_name},base_url={url}/v1/completions,"
                      f"tokenizer={args.checkpoint},tokenizer_backend=huggingface,tokenized_requests=True,"
                      "num_concurrent=2,max_retries=1,timeout=120")
    manager = TaskManager(include_path=".")
    out = {}
    for name, (model, model_args) in runs.items():
        res = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=TASKS, task_manager=manager,
                                      batch_size=4, log_samples=True, random_seed=0, numpy_random_seed=0,
                                      torch_random_seed=0, fewshot_random_seed=0)
        metrics = {t: {k: v for k, v in r.items() if isinstance(v, int | float)} for t, r in res["results"].items()}
        out[name] = {
            "results": metrics,
            "samples": {t: [{"doc_id": s["doc_id"], "resps": s["resps"], "filtered_resps": s["filtered_resps"]}
                            for s in ss] for t, ss in res["samples"].items()},
        }
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()

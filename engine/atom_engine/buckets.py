"""vLLM's histogram bucket families, so a dashboard or an SLO written for vLLM reads the same ``le`` bounds here.

The values are vLLM 0.32.0's defaults (``vllm/v1/metrics/buckets.py``); each vLLM histogram draws its bounds
from one family (``vllm/v1/metrics/loggers.py``), and so does each of ours. tests/serving/vllm_metrics.txt
records which family each vLLM name uses, and a test checks the served bounds against it.
"""

from __future__ import annotations

REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                       40.0, 80.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def request_tokens(max_model_len: int) -> tuple[float, ...]:
    """vLLM's token-count family: a 1-2-5 series up to the model's length (``build_1_2_5_buckets``)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10

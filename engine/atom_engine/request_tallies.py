"""vLLM's request-level histograms, observed once per request as the batcher makes its final output.

The phases are vLLM's (``IterationStats.update_from_finished_request``): queued from arrival to the lane
(admission), prefill from the lane to the first token, decode from the first token to the last, inference from
the lane to the last token, and time per output token the decode phase over the tokens after the first. A
request that ended before a phase began (cancelled in the queue, refused at admission) is counted by its finish
reason and its token counts but adds no sample to the phases it never had: a zero there would read as an
instant phase.

Reasons are vLLM's ``finished_reason`` label values; ours map onto them (cancelled: vLLM's abort). vLLM's
``repetition`` (its hallucination detector) never happens here; its series exists at 0, as in vLLM, so a query
over every reason finds them all.
"""

from __future__ import annotations

from atom_engine import buckets
from atom_engine.sequence import FinishReason, Sequence
from atom_engine.stats import RequestStats
from atom_engine.tally import Tally

REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.CANCELLED: "abort",
           FinishReason.ERROR: "error"}
VLLM_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM's FINISH_REASON_STRINGS, in its order


class RequestTallies:
    def __init__(self, max_seq_len: int) -> None:
        latency, tokens = buckets.REQUEST_LATENCY, buckets.request_tokens(max_seq_len)
        self.queue_time, self.prefill_time = Tally(latency), Tally(latency)
        self.decode_time, self.inference_time = Tally(latency), Tally(latency)
        self.time_per_output_token = Tally(buckets.INTER_TOKEN_LATENCY)
        self.prompt_tokens, self.generation_tokens = Tally(tokens), Tally(tokens)
        self.iteration_tokens = Tally(buckets.ITERATION_TOKENS)
        self.request_success = dict.fromkeys(VLLM_REASONS, 0)

    def ended(self, seq: Sequence, now: float) -> None:
        """``seq``'s final output is made at ``now`` (the batcher's clock); its finish reason is final."""
        assert seq.finish_reason is not None
        self.request_success[REASONS[seq.finish_reason]] += 1  # one writer (the step thread); a scrape copies the dict
        self.prompt_tokens.observe(len(seq.prompt))
        self.generation_tokens.observe(len(seq.output))
        if seq.admitted_at is not None:
            self.queue_time.observe(seq.admitted_at - seq.arrived_at)
            if seq.decode_began is not None:
                decode = now - seq.decode_began
                self.prefill_time.observe(seq.decode_began - seq.admitted_at)
                self.decode_time.observe(decode)
                self.inference_time.observe(now - seq.admitted_at)
                self.time_per_output_token.observe(decode / (len(seq.output) - 1) if len(seq.output) > 1 else 0.0)

    def iteration(self, tokens: int) -> None:
        """A step computed ``tokens``: prompt tokens prefilled here and tokens generated (vLLM's iteration)."""
        if tokens > 0:
            self.iteration_tokens.observe(tokens)

    def stats(self) -> RequestStats:
        return RequestStats(self.queue_time.snapshot(), self.prefill_time.snapshot(), self.decode_time.snapshot(),
                            self.inference_time.snapshot(), self.time_per_output_token.snapshot(),
                            self.prompt_tokens.snapshot(), self.generation_tokens.snapshot(),
                            self.iteration_tokens.snapshot(), dict(self.request_success))

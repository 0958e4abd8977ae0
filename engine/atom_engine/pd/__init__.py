"""Prefill/decode disaggregation: the KV wire format, the prefill worker, and the decode side's client."""

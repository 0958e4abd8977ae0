"""Linear layers packed for the eager cpu backend's few-row matmuls (a decode step multiplies ``lanes`` rows).

Linears that read the same input (q/k/v, gate/up) become one weight, so a step runs one wide matmul instead of
several narrow ones. Where torch has oneDNN (x86 builds), the model is float32 (or bfloat16 on a CPU with native
bfloat16 dot products, AVX-512 BF16 or AMX) and the weight is not small, the weight is reordered once into
oneDNN's blocked layout, which multiplies a few rows (a decode step) and a prefill chunk faster than ``F.linear``
(MKL) does. Elsewhere (small weights, float64, float16, builds without oneDNN) the weight is one dense ``[in, out]``
matrix, which streams better than ``F.linear``'s ``[out, in]`` for a few rows. The timings behind both choices:
benchmarks/results/measured-in-place.md.

Packing moves the weights: each packed linear's parameters are replaced by meta tensors (shape and dtype, no
storage), so the weights are not held twice and a packed model fails loudly if anything but this path reads them.
A weight shared with another module (a head tied to the embedding) is copied and left in place.
"""

from __future__ import annotations

import torch
from torch import nn

# oneDNN costs a fixed overhead per call over a dense matmul, which only a large enough weight earns back: every
# linear of the benchmark's model (the smallest, o_proj, is 256 x 256) is faster with it, builtin:tiny's are slower
# (benchmarks/results/measured-in-place.md).
ONEDNN_MIN_WEIGHT = 256 * 256


def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether this torch can pack ``dtype`` weights for oneDNN (bfloat16 only where the CPU computes it natively;
    oneDNN's emulation elsewhere is slower than the dense path)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear:
    def __init__(self, *linears: nn.Linear, shared: bool = False, onednn: bool | None = None) -> None:
        """``shared``: the weight is also used elsewhere, so it is copied and not released. ``onednn``: force the
        layout (tests); by default oneDNN where :func:`onednn_packs` and the weight has ``ONEDNN_MIN_WEIGHT``
        elements or more."""
        with torch.no_grad():
            weight = torch.cat([lin.weight for lin in linears])  # [sum(out), in]
            biases = [lin.bias for lin in linears]
            self.bias = None if biases[0] is None else torch.cat(biases)
            if onednn is None:
                self.onednn = onednn_packs(weight.dtype) and weight.numel() >= ONEDNN_MIN_WEIGHT
            else:
                self.onednn = onednn
            if self.onednn:
                try:
                    self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
                except RuntimeError:  # a build whose oneDNN has no kernel for this CPU: the dense layout works
                    if onednn:
                        raise
                    self.onednn = False
            if not self.onednn:
                self.weight = weight.t().contiguous()  # [in, out]
        self.out_features = weight.shape[0]
        if not shared:
            for lin in linears:
                _release(lin)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.bias is None:
            return torch.matmul(x, self.weight)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], self.out_features)


def _release(lin: nn.Linear) -> None:
    lin.weight = nn.Parameter(lin.weight.detach().to("meta"), requires_grad=False)
    if lin.bias is not None:
        lin.bias = nn.Parameter(lin.bias.detach().to("meta"), requires_grad=False)

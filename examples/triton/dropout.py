"""Fused dropout + residual add, as in the fused dropout/residual/norm kernels of transformer
libraries: h = dropout(x, p) + residual, row by row. The mask is not saved: it is drawn from
`tl.rand(seed, offsets)` (Triton's Philox), and the backward draws it again from the same seed and
offsets, so it needs no memory.
"""
import triton
import triton.language as tl


@triton.jit
def _dropout_add_fwd(X, RES, H, stride, N, p, seed, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offsets = row * stride + cols
    x = tl.load(X + offsets, mask=mask, other=0.0)
    res = tl.load(RES + offsets, mask=mask, other=0.0)
    keep = tl.rand(seed, offsets) > p
    h = tl.where(keep, x / (1 - p), 0.0) + res
    tl.store(H + offsets, h, mask=mask)

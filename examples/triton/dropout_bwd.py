"""Backward of the fused dropout + residual add (`dropout.py`): dx = dh / (1 - p) where the
element was kept and 0 where it was dropped, with the mask drawn again from the forward's seed and
offsets; dresidual = dh.

`_dropout_add_bwd` is correct; each `_dropout_add_bwd_broken_*` differs from it in one line, marked
with a comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def _dropout_add_bwd(DH, DX, DRES, stride, N, p, seed, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offsets = row * stride + cols
    dh = tl.load(DH + offsets, mask=mask, other=0.0)
    keep = tl.rand(seed, offsets) > p
    tl.store(DX + offsets, tl.where(keep, dh / (1 - p), 0.0), mask=mask)
    tl.store(DRES + offsets, dh, mask=mask)


@triton.jit
def _dropout_add_bwd_broken_offset(DH, DX, DRES, stride, N, p, seed, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offsets = row * stride + cols
    dh = tl.load(DH + offsets, mask=mask, other=0.0)
    keep = tl.rand(seed, offsets + 1) > p  # BUG: the mask is drawn at other offsets than the forward's
    tl.store(DX + offsets, tl.where(keep, dh / (1 - p), 0.0), mask=mask)
    tl.store(DRES + offsets, dh, mask=mask)


@triton.jit
def _dropout_add_bwd_broken_scale(DH, DX, DRES, stride, N, p, seed, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    offsets = row * stride + cols
    dh = tl.load(DH + offsets, mask=mask, other=0.0)
    keep = tl.rand(seed, offsets) > p
    tl.store(DX + offsets, tl.where(keep, dh, 0.0), mask=mask)  # BUG: the kept elements' 1 / (1 - p) scale is dropped
    tl.store(DRES + offsets, dh, mask=mask)

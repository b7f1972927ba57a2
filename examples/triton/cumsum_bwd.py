"""Backward of cumsum.py: the reversed scan of the cotangent, dx[r, j] = sum_{k >= j} dy[r, k]
(k > j when EXCLUSIVE), with column blocks visited from the last to the first in a `while` loop
carrying the sum of the blocks already seen.

`_cumsum_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _cumsum_bwd(DY, DX, stride, n_cols, EXCLUSIVE: tl.constexpr = False, BLOCK: tl.constexpr = 1024):
    row = tl.program_id(0).to(tl.int64)
    DY += row * stride
    DX += row * stride
    start = ((n_cols + BLOCK - 1) // BLOCK - 1) * BLOCK
    carry = 0.0
    while start >= 0:
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_cols
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        dx = tl.cumsum(dy, axis=0, reverse=True) + carry
        if EXCLUSIVE:
            dx = dx - dy
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        carry += tl.sum(dy, axis=0)
        start -= BLOCK


@triton.jit
def _cumsum_bwd_broken_forward(DY, DX, stride, n_cols, EXCLUSIVE: tl.constexpr = False, BLOCK: tl.constexpr = 1024):
    row = tl.program_id(0).to(tl.int64)
    DY += row * stride
    DX += row * stride
    start = ((n_cols + BLOCK - 1) // BLOCK - 1) * BLOCK
    carry = 0.0
    while start >= 0:
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_cols
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        dx = tl.cumsum(dy, axis=0) + carry  # BUG: scans the block forwards: the transpose of a prefix sum is a suffix sum
        if EXCLUSIVE:
            dx = dx - dy
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        carry += tl.sum(dy, axis=0)
        start -= BLOCK


@triton.jit
def _cumsum_bwd_broken_carry(DY, DX, stride, n_cols, EXCLUSIVE: tl.constexpr = False, BLOCK: tl.constexpr = 1024):
    row = tl.program_id(0).to(tl.int64)
    DY += row * stride
    DX += row * stride
    start = ((n_cols + BLOCK - 1) // BLOCK - 1) * BLOCK
    carry = 0.0
    while start >= 0:
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n_cols
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        dx = tl.cumsum(dy, axis=0, reverse=True) + carry
        if EXCLUSIVE:
            dx = dx - dy
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)
        carry = tl.sum(dy, axis=0)  # BUG: carries only the last block, not every block after this one
        start -= BLOCK

"""Backward of copy (dst = src): grad_src = grad_dst.

`copy_bwd` is correct; each `copy_bwd_broken_*` differs from it in one line, marked with a
comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def copy_bwd(grad_dst_ptr, grad_src_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_dst_ptr + offs, mask=mask, other=0.0)
    tl.store(grad_src_ptr + offs, g, mask=mask)


@triton.jit
def copy_bwd_broken_mask(grad_dst_ptr, grad_src_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_dst_ptr + offs, mask=mask, other=0.0)
    tl.store(grad_src_ptr + offs, g)  # BUG: no mask, the last program writes past n


@triton.jit
def copy_bwd_broken_shift(grad_dst_ptr, grad_src_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_dst_ptr + offs + 1, mask=offs + 1 < n, other=0.0)  # BUG: index shifted by one
    tl.store(grad_src_ptr + offs, g, mask=mask)


@triton.jit
def copy_bwd_broken_accumulate(grad_dst_ptr, grad_src_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_dst_ptr + offs, mask=mask, other=0.0) + tl.load(grad_src_ptr + offs, mask=mask, other=0.0)  # BUG: accumulates into grad_src, which was allocated empty (not zeroed)
    tl.store(grad_src_ptr + offs, g, mask=mask)

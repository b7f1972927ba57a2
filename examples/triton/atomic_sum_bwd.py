"""Backward of atomic_sum (out += sum x, accumulated with atomic_add): grad_x[i] = grad_out.

`atomic_sum_bwd` is correct; each `atomic_sum_bwd_broken_*` differs from it in one line, marked
with a comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def atomic_sum_bwd(grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_out_ptr)
    tl.store(grad_x_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32) + g, mask=mask)


@triton.jit
def atomic_sum_bwd_broken_mask(grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_out_ptr)
    tl.store(grad_x_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32) + g)  # BUG: no mask, the last program writes past n


@triton.jit
def atomic_sum_bwd_broken_mean(grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_out_ptr) / n  # BUG: scaled by 1 / n as if the forward were a mean
    tl.store(grad_x_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32) + g, mask=mask)


@triton.jit
def atomic_sum_bwd_broken_block_mask(grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < BLOCK  # BUG: compares with BLOCK instead of n, only the first program writes
    g = tl.load(grad_out_ptr)
    tl.store(grad_x_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32) + g, mask=mask)

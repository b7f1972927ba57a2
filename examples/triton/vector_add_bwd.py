"""Backward of vector_add (out = x + y): grad_x = grad_y_out = grad_out.

`vector_add_bwd` is correct; each `vector_add_bwd_broken_*` differs from it in one line, marked
with a comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def vector_add_bwd(grad_out_ptr, grad_x_ptr, grad_y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_out_ptr + offs, mask=mask, other=0.0)
    tl.store(grad_x_ptr + offs, g, mask=mask)
    tl.store(grad_y_ptr + offs, g, mask=mask)


@triton.jit
def vector_add_bwd_broken_mask(grad_out_ptr, grad_x_ptr, grad_y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(grad_out_ptr + offs)  # BUG: no mask, the last program reads past n
    tl.store(grad_x_ptr + offs, g, mask=mask)
    tl.store(grad_y_ptr + offs, g, mask=mask)


@triton.jit
def vector_add_bwd_broken_off_by_one(grad_out_ptr, grad_x_ptr, grad_y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n - 1  # BUG: off by one, the last element of grad_x and grad_y is never written
    g = tl.load(grad_out_ptr + offs, mask=mask, other=0.0)
    tl.store(grad_x_ptr + offs, g, mask=mask)
    tl.store(grad_y_ptr + offs, g, mask=mask)


@triton.jit
def vector_add_bwd_broken_tile_start(grad_out_ptr, grad_x_ptr, grad_y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid + tl.arange(0, BLOCK)  # BUG: tile start not scaled by BLOCK, programs overlap
    mask = offs < n
    g = tl.load(grad_out_ptr + offs, mask=mask, other=0.0)
    tl.store(grad_x_ptr + offs, g, mask=mask)
    tl.store(grad_y_ptr + offs, g, mask=mask)

"""Backward of the two-launch L2 norm (l2_norm_partial, then l2_norm_finish: out = sqrt(sum x^2)):
grad_x = grad_out * x / out, with `out` saved from the forward.

`l2_norm_bwd` is correct; each `l2_norm_bwd_broken_*` differs from it in one line, marked with a
comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def l2_norm_bwd(x_ptr, out_ptr, grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    norm = tl.load(out_ptr)
    g = tl.load(grad_out_ptr)
    tl.store(grad_x_ptr + offs, g * x / norm, mask=mask)


@triton.jit
def l2_norm_bwd_broken_scale(x_ptr, out_ptr, grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    norm = tl.load(out_ptr)
    g = tl.load(grad_out_ptr)
    tl.store(grad_x_ptr + offs, g * x, mask=mask)  # BUG: the 1 / norm factor is dropped


@triton.jit
def l2_norm_bwd_broken_factor_two(x_ptr, out_ptr, grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    norm = tl.load(out_ptr)
    g = tl.load(grad_out_ptr)
    tl.store(grad_x_ptr + offs, 2.0 * g * x / norm, mask=mask)  # BUG: the 1/2 of d sqrt(s) / ds is dropped


@triton.jit
def l2_norm_bwd_broken_norm_index(x_ptr, out_ptr, grad_out_ptr, grad_x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    norm = tl.load(out_ptr + pid)  # BUG: the norm is one scalar, indexed by program id it is read out of bounds
    g = tl.load(grad_out_ptr)
    tl.store(grad_x_ptr + offs, g * x / norm, mask=mask)

"""Softplus (PyTorch's, with its threshold of 20) in a module that binds its helpers as kernel
libraries do: `triton_cast` by a Triton version check (Triton 2 had no `tl.cast` taking a
Python number), `exp` by an environment switch that selects an inline-assembly helper for one
GPU family. The check sees the binding Python makes for the Triton version, environment and
device of the spec's `[check]` table (or `--triton-version`, `--env`, `--device`).

`softplus_bwd` is correct; `softplus_bwd_broken_sign` differs from it in one line, marked with
a comment saying what is wrong.
"""
import os

import triton
import triton.language as tl
from packaging.version import Version

if Version(triton.__version__) >= Version("3.0.0"):
    triton_cast = tl.cast
else:

    @triton.jit
    def triton_cast(x, dtype):
        return x.to(dtype)


if os.environ.get("EXAMPLE_FAST_OPS", "0") == "1":

    @triton.jit
    def exp(x):
        # ex2.approx on sm_90 and newer only: 2 ** (x * log2(e)).
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634], dtype=tl.float32, is_pure=True, pack=1
        )

else:
    exp = tl.exp


@triton.jit
def softplus_fwd(x_ptr, y_ptr, n, BLOCK: tl.constexpr, THRESHOLD: tl.constexpr = 20):
    """y = log(1 + exp(x)), and x itself above the threshold."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.maximum(x, 0.0) + tl.log(1.0 + exp(-tl.abs(x)))
    y = tl.where(x > triton_cast(THRESHOLD, tl.float32), x, y)
    tl.store(y_ptr + offs, y, mask=mask)


@triton.jit
def softplus_bwd(grad_y_ptr, x_ptr, grad_x_ptr, n, BLOCK: tl.constexpr, THRESHOLD: tl.constexpr = 20):
    """grad_x = grad_y * sigmoid(x), and grad_y above the threshold."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    dy = tl.load(grad_y_ptr + offs, mask=mask, other=0.0)
    limit = triton_cast(THRESHOLD, tl.float32)
    tl.store(grad_x_ptr + offs, tl.where(x > limit, dy, dy / (1.0 + exp(-x))), mask=mask)


@triton.jit
def softplus_bwd_broken_sign(grad_y_ptr, x_ptr, grad_x_ptr, n, BLOCK: tl.constexpr, THRESHOLD: tl.constexpr = 20):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    dy = tl.load(grad_y_ptr + offs, mask=mask, other=0.0)
    limit = triton_cast(THRESHOLD, tl.float32)
    tl.store(grad_x_ptr + offs, tl.where(x > limit, dy, dy / (1.0 + exp(x))), mask=mask)  # BUG: sigmoid(-x): the sign of x is lost

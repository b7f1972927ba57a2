"""Backward of scale_leaky_relu.py in two launches, as fused-MLP libraries write it: a first
kernel applies the activation's derivative to the upstream gradient, once, into a buffer that
the launches after it read.

    _leaky_relu_bwd: dz = dy * leaky_relu'(z)                     grid (rows,)
    _scale_bwd:      dx = dz * gamma; partial_dgamma[r] = dz * x  grid (rows,)
                     dgamma = partial_dgamma.sum(0) on the host

`_leaky_relu_bwd_broken_*` differ from their correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _leaky_relu_bwd(Z, DY, DZ, stride, n_cols, negative_slope, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    z = tl.load(Z + row * stride + cols, mask=mask, other=0.0)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0)
    dz = tl.where(z >= 0, dy, dy * negative_slope)
    tl.store(DZ + row * stride + cols, dz, mask=mask)


@triton.jit
def _leaky_relu_bwd_broken_slope(Z, DY, DZ, stride, n_cols, negative_slope, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    z = tl.load(Z + row * stride + cols, mask=mask, other=0.0)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0)
    dz = tl.where(z >= 0, dy, 0.0)  # BUG: a plain ReLU mask, the negative slope dropped
    tl.store(DZ + row * stride + cols, dz, mask=mask)


@triton.jit
def _scale_bwd(X, GAMMA, DZ, DX, DGAMMA_PARTIAL, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dz = tl.load(DZ + row * stride + cols, mask=mask, other=0.0)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0)
    tl.store(DX + row * stride + cols, dz * gamma, mask=mask)
    tl.store(DGAMMA_PARTIAL + row * stride + cols, dz * x, mask=mask)

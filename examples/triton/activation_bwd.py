"""Backward of activation.py: grad_x = act'(x) * grad_y, for the activation the constexpr names
(None is the identity). `triton.jit` is applied as a call, rebinding the name.

`_activation_bwd_broken_*` variants differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice


def _activation_bwd(X, DY, DX, n_elements, negative_slope: tl.constexpr = 0.01, ACTIVATION: tl.constexpr = None,
                    BLOCK: tl.constexpr = 1024):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == "leaky_relu":
        dx = tl.where(x >= 0, dy, dy * negative_slope)
    elif ACTIVATION == "relu6":
        dx = tl.where((x > 0) & (x < 6.0), dy, 0.0)
    elif ACTIVATION == "tanh_gelu":
        k = 0.7978845608028654
        t = libdevice.tanh(k * (x + 0.044715 * x * x * x))
        dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x))
    else:
        dx = dy
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)


_activation_bwd = triton.jit(_activation_bwd)


def _activation_bwd_broken_slope(X, DY, DX, n_elements, negative_slope: tl.constexpr = 0.01,
                                 ACTIVATION: tl.constexpr = None, BLOCK: tl.constexpr = 1024):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == "leaky_relu":
        dx = tl.where(x >= 0, dy, 0.0)  # BUG: drops the negative slope
    elif ACTIVATION == "relu6":
        dx = tl.where((x > 0) & (x < 6.0), dy, 0.0)
    elif ACTIVATION == "tanh_gelu":
        k = 0.7978845608028654
        t = libdevice.tanh(k * (x + 0.044715 * x * x * x))
        dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x))
    else:
        dx = dy
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)


_activation_bwd_broken_slope = triton.jit(_activation_bwd_broken_slope)


def _activation_bwd_broken_gelu(X, DY, DX, n_elements, negative_slope: tl.constexpr = 0.01,
                                ACTIVATION: tl.constexpr = None, BLOCK: tl.constexpr = 1024):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == "leaky_relu":
        dx = tl.where(x >= 0, dy, dy * negative_slope)
    elif ACTIVATION == "relu6":
        dx = tl.where((x > 0) & (x < 6.0), dy, 0.0)
    elif ACTIVATION == "tanh_gelu":
        k = 0.7978845608028654
        t = libdevice.tanh(k * (x + 0.044715 * x * x * x))
        dx = dy * (0.5 * (1 + t))  # BUG: only the first term of the product rule
    else:
        dx = dy
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)


_activation_bwd_broken_gelu = triton.jit(_activation_bwd_broken_gelu)


def _activation_bwd_broken_half(X, DY, DX, n_elements, negative_slope: tl.constexpr = 0.01,
                                ACTIVATION: tl.constexpr = None, BLOCK: tl.constexpr = 1024):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask).to(tl.float32)
    if ACTIVATION == "leaky_relu":
        dx = tl.where(x >= 0, dy, dy * negative_slope)
    elif ACTIVATION == "relu6":
        dx = tl.where((x > 0) & (x < 6.0), dy, 0.0)
    elif ACTIVATION == "tanh_gelu":
        k = 0.7978845608028654
        t = libdevice.tanh(k * (x + 0.044715 * x * x * x))
        cdf = 0.5 * t  # BUG: the constant term of 0.5 * (1 + t) is dropped
        dx = dy * (cdf + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x))
    else:
        dx = dy
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)


_activation_bwd_broken_half = triton.jit(_activation_bwd_broken_half)

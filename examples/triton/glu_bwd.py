"""Backward of glu.py, in place as memory-saving MLP kernels do it: each program reads its row of
a and b, then overwrites a with grad_a and b with grad_b (dc is the cotangent of c):

    grad_a = dc * b * act'(a),  grad_b = dc * act(a)
    silu:      act' = s * (1 + a * (1 - s)),  s = sigmoid(a)
    gelu_tanh: act' = 0.5 * (1 + t) + 0.5 * a * (1 - t^2) * k * (1 + 3 * 0.044715 * a^2),  k = sqrt(2 / pi)

`_glu_backward_kernel_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl

from glu_utils import gelu_tanh


@triton.jit
def _glu_backward_kernel(dc, A, B, stride, n_cols, ACT: tl.constexpr = "silu", BLOCK_SIZE: tl.constexpr = 1024):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    dc_row = tl.load(dc + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    a = tl.load(A + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    b = tl.load(B + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    if ACT == "silu":
        s = tl.sigmoid(a)
        act = a * s
        dact = s * (1.0 + a * (1.0 - s))
    elif ACT == "gelu_tanh":
        act, t = gelu_tanh(a)
        dact = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * a * a)
    db = dc_row * act
    da = dc_row * b * dact
    # In place: the gradients overwrite the inputs.
    tl.store(A + row * stride + offsets, da.to(A.dtype.element_ty), mask=mask)
    tl.store(B + row * stride + offsets, db.to(B.dtype.element_ty), mask=mask)


@triton.jit
def _glu_backward_kernel_broken_silu(dc, A, B, stride, n_cols, ACT: tl.constexpr = "silu", BLOCK_SIZE: tl.constexpr = 1024):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    dc_row = tl.load(dc + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    a = tl.load(A + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    b = tl.load(B + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    if ACT == "silu":
        s = tl.sigmoid(a)
        act = a * s
        dact = s * (1.0 - s)  # BUG: the derivative of sigmoid, not of a * sigmoid(a)
    elif ACT == "gelu_tanh":
        act, t = gelu_tanh(a)
        dact = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * a * a)
    db = dc_row * act
    da = dc_row * b * dact
    # In place: the gradients overwrite the inputs.
    tl.store(A + row * stride + offsets, da.to(A.dtype.element_ty), mask=mask)
    tl.store(B + row * stride + offsets, db.to(B.dtype.element_ty), mask=mask)


@triton.jit
def _glu_backward_kernel_broken_gelu(dc, A, B, stride, n_cols, ACT: tl.constexpr = "silu", BLOCK_SIZE: tl.constexpr = 1024):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    dc_row = tl.load(dc + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    a = tl.load(A + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    b = tl.load(B + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    if ACT == "silu":
        s = tl.sigmoid(a)
        act = a * s
        dact = s * (1.0 + a * (1.0 - s))
    elif ACT == "gelu_tanh":
        act, t = gelu_tanh(a)
        dact = 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * 0.7978845608028654  # BUG: drops the derivative of the cubic term
    db = dc_row * act
    da = dc_row * b * dact
    # In place: the gradients overwrite the inputs.
    tl.store(A + row * stride + offsets, da.to(A.dtype.element_ty), mask=mask)
    tl.store(B + row * stride + offsets, db.to(B.dtype.element_ty), mask=mask)

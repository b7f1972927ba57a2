"""Gated linear units in the style of fused-MLP kernels: c = act(a) * b, one row per program,
with `ACT: tl.constexpr` a string ("silu": SwiGLU, "gelu_tanh": GeGLU with the tanh
approximation from a helper module). The kernel is made by applying `triton.jit` as a call.
"""
import triton
import triton.language as tl

from glu_utils import gelu_tanh


def _glu_forward(A, B, C, stride, n_cols, ACT: tl.constexpr = "silu", BLOCK_SIZE: tl.constexpr = 1024):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    a = tl.load(A + row * stride + offsets, mask=mask, other=0).to(tl.float32)
    b = tl.load(B + row * stride + offsets, mask=mask, other=0)
    if ACT == "silu":
        act = a * tl.sigmoid(a)
    elif ACT == "gelu_tanh":
        act, _ = gelu_tanh(a)
    c = act.to(b.dtype) * b
    tl.store(C + row * stride + offsets, c, mask=mask)


_glu_forward_kernel = triton.jit(_glu_forward)

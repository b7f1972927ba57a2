"""RMS norm forward in the style of fused-kernel libraries: one row per program,
y = (x * rstd).to(X_dtype) * (offset + w) with rstd = 1 / sqrt(mean(x^2) + eps), rstd saved
for the backward. `eps` is a float constexpr, `X_dtype` a dtype constexpr, `offset` a float
constexpr (Gemma-style `1 + w` weights use offset=1.0), and `rsqrt` comes from libdevice under
whichever import path the installed Triton has.
"""
import triton
import triton.language as tl

try:
    # Triton >= 3.0
    from triton.language.extra.libdevice import rsqrt
except ModuleNotFoundError:
    # older Triton
    from triton.language.math import rsqrt


@triton.jit
def _rms_norm_forward_kernel(
    Y_ptr,
    Y_row_stride,
    X_ptr,
    X_row_stride,
    W_ptr,
    RSTD_ptr,
    n_cols,
    eps: tl.constexpr,
    offset: tl.constexpr,
    X_dtype: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    X_row = tl.load(X_ptr + row_idx * X_row_stride + col_offsets, mask=mask, other=0)
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0)
    # Statistics in f32 whatever the input dtype.
    if X_dtype == tl.float16 or X_dtype == tl.bfloat16:
        X_row = X_row.to(tl.float32)

    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols
    rstd = rsqrt(mean_square + eps)
    tl.store(RSTD_ptr + row_idx, rstd)

    Y_row = (X_row * rstd).to(X_dtype) * (offset + W_row)
    tl.store(Y_ptr + row_idx * Y_row_stride + col_offsets, Y_row, mask=mask)

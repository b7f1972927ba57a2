"""Backward of rms_norm.py, one row per program (xhat = x * rstd, wo = offset + w):

    dx = rstd * (dy * wo) - rstd^3 / n_cols * sum(dy * wo * x) * x
    dw = sum over rows of dy * xhat (one row of partial dw per program, summed on the host)

`_rms_norm_backward_kernel_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _rms_norm_backward_kernel(
    dY_ptr,
    dY_row_stride,
    dX_ptr,
    dX_row_stride,
    X_ptr,
    X_row_stride,
    W_ptr,
    RSTD_ptr,
    dW_ptr,
    dW_row_stride,
    n_cols,
    offset: tl.constexpr,
    X_dtype: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    dY_row = tl.load(dY_ptr + row_idx * dY_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    X_row = tl.load(X_ptr + row_idx * X_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0).to(tl.float32) + offset
    rstd = tl.load(RSTD_ptr + row_idx)

    m = dY_row * W_row
    dX_row = rstd * m - (rstd * rstd * rstd / n_cols) * tl.sum(m * X_row, axis=0) * X_row
    tl.store(dW_ptr + row_idx * dW_row_stride + col_offsets, dY_row * (X_row * rstd), mask=mask)
    tl.store(dX_ptr + row_idx * dX_row_stride + col_offsets, dX_row.to(X_dtype), mask=mask)


@triton.jit
def _rms_norm_backward_kernel_broken_no_offset(
    dY_ptr,
    dY_row_stride,
    dX_ptr,
    dX_row_stride,
    X_ptr,
    X_row_stride,
    W_ptr,
    RSTD_ptr,
    dW_ptr,
    dW_row_stride,
    n_cols,
    offset: tl.constexpr,
    X_dtype: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    dY_row = tl.load(dY_ptr + row_idx * dY_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    X_row = tl.load(X_ptr + row_idx * X_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0).to(tl.float32)  # BUG: forgets the offset
    rstd = tl.load(RSTD_ptr + row_idx)

    m = dY_row * W_row
    dX_row = rstd * m - (rstd * rstd * rstd / n_cols) * tl.sum(m * X_row, axis=0) * X_row
    tl.store(dW_ptr + row_idx * dW_row_stride + col_offsets, dY_row * (X_row * rstd), mask=mask)
    tl.store(dX_ptr + row_idx * dX_row_stride + col_offsets, dX_row.to(X_dtype), mask=mask)


@triton.jit
def _rms_norm_backward_kernel_broken_dw(
    dY_ptr,
    dY_row_stride,
    dX_ptr,
    dX_row_stride,
    X_ptr,
    X_row_stride,
    W_ptr,
    RSTD_ptr,
    dW_ptr,
    dW_row_stride,
    n_cols,
    offset: tl.constexpr,
    X_dtype: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    dY_row = tl.load(dY_ptr + row_idx * dY_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    X_row = tl.load(X_ptr + row_idx * X_row_stride + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0).to(tl.float32) + offset
    rstd = tl.load(RSTD_ptr + row_idx)

    m = dY_row * W_row
    dX_row = rstd * m - (rstd * rstd * rstd / n_cols) * tl.sum(m * X_row, axis=0) * X_row
    tl.store(dW_ptr + row_idx * dW_row_stride + col_offsets, dY_row * X_row, mask=mask)  # BUG: dw without rstd
    tl.store(dX_ptr + row_idx * dX_row_stride + col_offsets, dX_row.to(X_dtype), mask=mask)

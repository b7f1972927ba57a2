"""A fused RMS norm as kernel libraries write it: a Triton forward kernel, a hand-written Triton
backward kernel, and the `torch.autograd.Function` that launches them.

    y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)   (over the last dimension, per row)
    dx = rstd * (dy * w) - rstd^3 / n * sum(dy * w * x) * x
    dw = sum over rows of dy * x * rstd   (one row of partial sums per program, summed on the host)

`test_fused_rms_norm.py` checks its backward with tilegrad.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_fwd_kernel(Y, X, W, RSTD, stride_y, stride_x, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_bwd_kernel(DX, DW_ROWS, DY, X, W, RSTD, stride_dx, stride_dy, stride_x, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    m = dy * w
    dx = rstd * m - (rstd * rstd * rstd / n_cols) * tl.sum(m * x, axis=0) * x
    tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_ROWS + row * n_cols + cols, dy * x * rstd, mask=mask)


class RMSNormFunction(torch.autograd.Function):
    """`RMSNormFunction.apply(x, w, eps)`: RMS norm of `x` (any shape) over its last dimension."""

    @staticmethod
    def forward(ctx, x, w, eps=1e-6):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        n_rows, n_cols = x2.shape
        y = torch.empty_like(x2)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(n_cols)
        rms_norm_fwd_kernel[(n_rows,)](y, x2, w, rstd, y.stride(0), x2.stride(0), n_cols, eps, BLOCK=block)
        ctx.save_for_backward(x2, w, rstd)
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, rstd = ctx.saved_tensors
        n_rows, n_cols = x2.shape
        dy2 = dy.reshape(-1, n_cols)
        dx = torch.empty_like(x2)
        dw_rows = torch.empty(n_rows, n_cols, dtype=torch.float32, device=x2.device)
        block = triton.next_power_of_2(n_cols)
        rms_norm_bwd_kernel[(n_rows,)](
            dx, dw_rows, dy2, x2, w, rstd, dx.stride(0), dy2.stride(0), x2.stride(0), n_cols, BLOCK=block
        )
        dw = dw_rows.sum(0).to(w.dtype)
        return dx.view(dy.shape), dw, None


def rms_norm(x, w, eps=1e-6):
    return RMSNormFunction.apply(x, w, eps)

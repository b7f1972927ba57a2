"""Backward of fused_add_rms_norm.py, one row per program. The cotangent of the residual stream
`dH` is updated in place: dH += the RMS-norm backward of dy, and that sum is the gradient of both
x and residual (h = x + r recomputed in f32, g = dy * w):

    dh = dH + rstd * g - rstd^3 / n_cols * sum(g * h) * h,   dw = sum over rows of dy * h * rstd

`_fused_add_rms_norm_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _fused_add_rms_norm_bwd(
    DY,
    DH,
    X,
    R,
    W,
    RSTD,
    DW,
    stride,
    n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    r = tl.load(R + row * stride + cols, mask=mask, other=0.0)
    h = tl.float32(x) + tl.float32(r)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    g = dy * w
    dh_norm = rstd * g - (rstd * rstd * rstd / n_cols) * tl.sum(g * h, axis=0) * h
    dh = tl.load(DH + row * stride + cols, mask=mask, other=0.0).to(tl.float32) + dh_norm
    tl.store(DH + row * stride + cols, dh.to(DH.dtype.element_ty), mask=mask)
    tl.store(DW + row * stride + cols, dy * h * rstd, mask=mask)


@triton.jit
def _fused_add_rms_norm_bwd_broken_residual(
    DY,
    DH,
    X,
    R,
    W,
    RSTD,
    DW,
    stride,
    n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    r = tl.load(R + row * stride + cols, mask=mask, other=0.0)
    h = tl.float32(x) + tl.float32(r)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    g = dy * w
    dh_norm = rstd * g - (rstd * rstd * rstd / n_cols) * tl.sum(g * h, axis=0) * h
    dh = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32) + dh_norm  # BUG: adds the cotangent of y, not the residual stream's own
    tl.store(DH + row * stride + cols, dh.to(DH.dtype.element_ty), mask=mask)
    tl.store(DW + row * stride + cols, dy * h * rstd, mask=mask)


@triton.jit
def _fused_add_rms_norm_bwd_broken_rstd(
    DY,
    DH,
    X,
    R,
    W,
    RSTD,
    DW,
    stride,
    n_cols,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    r = tl.load(R + row * stride + cols, mask=mask, other=0.0)
    h = tl.float32(x) + tl.float32(r)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + row)
    g = dy * w
    dh_norm = rstd * g - (rstd * rstd / n_cols) * tl.sum(g * h, axis=0) * h  # BUG: rstd squared, not cubed
    dh = tl.load(DH + row * stride + cols, mask=mask, other=0.0).to(tl.float32) + dh_norm
    tl.store(DH + row * stride + cols, dh.to(DH.dtype.element_ty), mask=mask)
    tl.store(DW + row * stride + cols, dy * h * rstd, mask=mask)

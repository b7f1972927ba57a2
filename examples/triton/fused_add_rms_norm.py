"""Residual add fused with RMS norm, in the style of transformer-block kernels: h = x + residual
is stored (the residual stream's next value, in its dtype), then y = h * rstd * w with rstd
= 1 / sqrt(mean(h^2) + eps) saved per row. When `x.dtype` is a 16-bit float, h is added in f32
after `tl.float32(x)`-style casts, and the statistics use that f32 sum; the kernel is
`triton.heuristics({...})(triton.jit(fn))`.
"""
import triton
import triton.language as tl


def _fused_add_rms_norm_fwd(
    X,
    R,
    H,
    Y,
    W,
    RSTD,
    stride,
    n_cols,
    eps: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    r = tl.load(R + row * stride + cols, mask=mask, other=0.0)
    if x.dtype == tl.bfloat16 or x.dtype == tl.float16:
        h = tl.float32(x) + tl.float32(r)
    else:
        h = x + r
    tl.store(H + row * stride + cols, h.to(H.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, (h * rstd * w).to(Y.dtype.element_ty), mask=mask)


fused_add_rms_norm_fwd = triton.heuristics({"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["n_cols"])})(
    triton.jit(_fused_add_rms_norm_fwd)
)

"""A layer norm over the last axis, one row per program, as kernel libraries write it: the row's
tail past `n_cols` is masked, and the forward fills it with `other=0.` so that its sums are right.

    y = (x - mean) * rstd * w + b, mean and rstd saved for the backward
"""
import triton
import triton.language as tl


@triton.jit
def layer_norm_tail_fwd(X, Y, W, B, Mean, Rstd, stride, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.)
    var = tl.sum(xc * xc, axis=0) / n_cols
    rstd = 1 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=mask)
    b = tl.load(B + cols, mask=mask)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    tl.store(Y + row * stride + cols, xc * rstd * w + b, mask=mask)

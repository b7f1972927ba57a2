"""Batch normalisation (training mode) in the style of fused normalisation kernels: x is
[N, C]; each program owns a block of channels and walks the rows in blocks, once for the mean,
once for the variance and once to write y = (x - mean) * rstd * w + b. Mean and rstd are saved
per channel; `eps` is a float constexpr and `X_dtype` a dtype constexpr for the output.
"""
import triton
import triton.language as tl


@triton.jit
def _batch_norm_fwd(
    X,
    Y,
    W,
    B,
    MEAN,
    RSTD,
    N,
    C,
    stride,
    eps: tl.constexpr,
    X_dtype: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(x, axis=0)
    mean = acc / N
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        xc = tl.where(mask, x - mean[None, :], 0.0)
        acc += tl.sum(xc * xc, axis=0)
    rstd = 1.0 / tl.sqrt(acc / N + eps)
    tl.store(MEAN + cols, mean, mask=col_mask)
    tl.store(RSTD + cols, rstd, mask=col_mask)
    w = tl.load(W + cols, mask=col_mask, other=0.0)
    b = tl.load(B + cols, mask=col_mask, other=0.0)
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = (x - mean[None, :]) * rstd[None, :] * w[None, :] + b[None, :]
        tl.store(Y + rows[:, None] * stride + cols[None, :], y.to(X_dtype), mask=mask)

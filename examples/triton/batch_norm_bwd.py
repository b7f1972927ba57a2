"""Backward of batch_norm.py from the saved mean and rstd; each program owns a block of channels,
so dw and db are written directly (xhat = (x - mean) * rstd, means over the N rows):

    db = sum dy,  dw = sum dy * xhat,  dx = w * rstd * (dy - db / N - xhat * dw / N)

`_batch_norm_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _batch_norm_bwd(
    X,
    DY,
    DX,
    W,
    MEAN,
    RSTD,
    DW,
    DB,
    N,
    C,
    stride,
    X_dtype: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    mean = tl.load(MEAN + cols, mask=col_mask, other=0.0)
    rstd = tl.load(RSTD + cols, mask=col_mask, other=0.0)
    w = tl.load(W + cols, mask=col_mask, other=0.0)
    sum_dy = tl.zeros([BLOCK_C], dtype=tl.float32)
    sum_dy_xhat = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean[None, :]) * rstd[None, :]
        sum_dy += tl.sum(dy, axis=0)
        sum_dy_xhat += tl.sum(dy * xhat, axis=0)
    tl.store(DB + cols, sum_dy, mask=col_mask)
    tl.store(DW + cols, sum_dy_xhat, mask=col_mask)
    mean_dy = sum_dy / N
    mean_dy_xhat = sum_dy_xhat / N
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean[None, :]) * rstd[None, :]
        dx = (w * rstd)[None, :] * (dy - mean_dy[None, :] - xhat * mean_dy_xhat[None, :])
        tl.store(DX + offsets, dx.to(X_dtype), mask=mask)


@triton.jit
def _batch_norm_bwd_broken_bessel(
    X,
    DY,
    DX,
    W,
    MEAN,
    RSTD,
    DW,
    DB,
    N,
    C,
    stride,
    X_dtype: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    mean = tl.load(MEAN + cols, mask=col_mask, other=0.0)
    rstd = tl.load(RSTD + cols, mask=col_mask, other=0.0)
    w = tl.load(W + cols, mask=col_mask, other=0.0)
    sum_dy = tl.zeros([BLOCK_C], dtype=tl.float32)
    sum_dy_xhat = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean[None, :]) * rstd[None, :]
        sum_dy += tl.sum(dy, axis=0)
        sum_dy_xhat += tl.sum(dy * xhat, axis=0)
    tl.store(DB + cols, sum_dy, mask=col_mask)
    tl.store(DW + cols, sum_dy_xhat, mask=col_mask)
    mean_dy = sum_dy / N
    mean_dy_xhat = sum_dy_xhat / (N - 1)  # BUG: Bessel's correction in the backward: the forward's variance divides by N
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean[None, :]) * rstd[None, :]
        dx = (w * rstd)[None, :] * (dy - mean_dy[None, :] - xhat * mean_dy_xhat[None, :])
        tl.store(DX + offsets, dx.to(X_dtype), mask=mask)


@triton.jit
def _batch_norm_bwd_broken_row_mask(
    X,
    DY,
    DX,
    W,
    MEAN,
    RSTD,
    DW,
    DB,
    N,
    C,
    stride,
    X_dtype: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    mean = tl.load(MEAN + cols, mask=col_mask, other=0.0)
    rstd = tl.load(RSTD + cols, mask=col_mask, other=0.0)
    w = tl.load(W + cols, mask=col_mask, other=0.0)
    sum_dy = tl.zeros([BLOCK_C], dtype=tl.float32)
    sum_dy_xhat = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] <= N) & col_mask[None, :]  # BUG: off by one: the row past the last enters the sums
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean[None, :]) * rstd[None, :]
        sum_dy += tl.sum(dy, axis=0)
        sum_dy_xhat += tl.sum(dy * xhat, axis=0)
    tl.store(DB + cols, sum_dy, mask=col_mask)
    tl.store(DW + cols, sum_dy_xhat, mask=col_mask)
    mean_dy = sum_dy / N
    mean_dy_xhat = sum_dy_xhat / N
    for start in range(0, N, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & col_mask[None, :]
        offsets = rows[:, None] * stride + cols[None, :]
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        xhat = (x - mean[None, :]) * rstd[None, :]
        dx = (w * rstd)[None, :] * (dy - mean_dy[None, :] - xhat * mean_dy_xhat[None, :])
        tl.store(DX + offsets, dx.to(X_dtype), mask=mask)

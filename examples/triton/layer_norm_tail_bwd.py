"""Backward of layer_norm_tail.py, one row per program, written as kernel libraries write it: the
row's tail is loaded *without* `other` and then reduced (`tl.sum(xhat * wdy)`). Triton documents
the masked-off lanes as undefined, but its NVIDIA and AMD backends read them as 0, so the sums are
right on every GPU: the check passes, with a note naming the loads.

    xhat = (x - mean) * rstd, wdy = w * dy
    dx = (wdy - (xhat * mean(xhat * wdy) + mean(wdy))) * rstd
    dw = sum over rows of dy * xhat, db = sum over rows of dy (one row of partials per program)

Each `*_broken_*` differs from `layer_norm_tail_bwd` in one line, marked with a comment.
"""
import triton
import triton.language as tl


@triton.jit
def layer_norm_tail_bwd(X, DY, DX, DW, DB, W, Mean, Rstd, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask).to(tl.float32)
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    xhat = (x - mean) * rstd
    wdy = w * dy
    c1 = tl.sum(xhat * wdy, axis=0) / n_cols
    c2 = tl.sum(wdy, axis=0) / n_cols
    dx = (wdy - (xhat * c1 + c2)) * rstd
    tl.store(DX + row * stride + cols, dx, mask=mask)
    tl.store(DW + row * stride + cols, dy * xhat, mask=mask)
    tl.store(DB + row * stride + cols, dy, mask=mask)


@triton.jit
def layer_norm_tail_bwd_broken_block_mean(X, DY, DX, DW, DB, W, Mean, Rstd, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask).to(tl.float32)
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    xhat = (x - mean) * rstd
    wdy = w * dy
    c1 = tl.sum(xhat * wdy, axis=0) / BLOCK_SIZE  # BUG: the mean over the block, not the row
    c2 = tl.sum(wdy, axis=0) / n_cols
    dx = (wdy - (xhat * c1 + c2)) * rstd
    tl.store(DX + row * stride + cols, dx, mask=mask)
    tl.store(DW + row * stride + cols, dy * xhat, mask=mask)
    tl.store(DB + row * stride + cols, dy, mask=mask)


@triton.jit
def layer_norm_tail_bwd_broken_dw(X, DY, DX, DW, DB, W, Mean, Rstd, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask).to(tl.float32)
    dy = tl.load(DY + row * stride + cols, mask=mask).to(tl.float32)
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    mean = tl.load(Mean + row)
    rstd = tl.load(Rstd + row)
    xhat = (x - mean) * rstd
    wdy = w * dy
    c1 = tl.sum(xhat * wdy, axis=0) / n_cols
    c2 = tl.sum(wdy, axis=0) / n_cols
    dx = (wdy - (xhat * c1 + c2)) * rstd
    tl.store(DX + row * stride + cols, dx, mask=mask)
    tl.store(DW + row * stride + cols, dy * x, mask=mask)  # BUG: x where the normalised xhat belongs
    tl.store(DB + row * stride + cols, dy, mask=mask)

"""Rows scaled by their inverse RMS and a per-row gain, on a 2-D grid (row, column block), as
kernels write it to avoid a second launch: every program of a row recomputes the row's RMS over
the whole row and stores it, so the programs of a row store the same bits to `Rstd[row]`. On a
GPU that is deterministic (whichever store lands last, the value is the same): a note, not a race.

    rstd = 1 / sqrt(mean(x[row, :]^2) + eps), y = x * rstd * g[row]

`row_rms_scale_fwd_broken_block_rms` stores the RMS of its own block instead, so the programs of
a row store different values to `Rstd[row]`: a race (and a wrong `rstd`).
"""
import triton
import triton.language as tl


@triton.jit
def _row_rstd(X, row, stride, n_cols, eps, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=0.)
        acc += x * x
    return 1 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)


@triton.jit
def row_rms_scale_fwd(X, G, Y, Rstd, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    rstd = _row_rstd(X, row, stride, n_cols, eps, BLOCK)
    tl.store(Rstd + row, rstd)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.)
    g = tl.load(G + row)
    tl.store(Y + row * stride + cols, x * rstd * g, mask=mask)


@triton.jit
def row_rms_scale_fwd_broken_block_rms(X, G, Y, Rstd, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)  # BUG: the sum over this block only
    tl.store(Rstd + row, rstd)
    g = tl.load(G + row)
    tl.store(Y + row * stride + cols, x * rstd * g, mask=mask)

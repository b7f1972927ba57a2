"""Backward of row_rms_scale.py on the same 2-D grid. With a = sum over the row of dy * x:

    dg[row] = a * rstd, dx = g * rstd * (dy - x * rstd^2 * a / n_cols)

Every program of a row computes `a` over the whole row and stores `dg[row]`: the same bits from
each, no atomics needed (a note, not a race).

`row_rms_scale_bwd_broken_partial_dg` stores `dg` from its own block's part of `a`: the programs
of a row store different values, a race.
"""
import triton
import triton.language as tl


@triton.jit
def _row_dot(X, DY, row, stride, n_cols, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < n_cols
        x = tl.load(X + row * stride + cols, mask=m, other=0.)
        dy = tl.load(DY + row * stride + cols, mask=m, other=0.)
        acc += dy * x
    return tl.sum(acc, axis=0)


@triton.jit
def row_rms_scale_bwd(X, G, DY, Rstd, DX, DG, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    rstd = tl.load(Rstd + row)
    g = tl.load(G + row)
    a = _row_dot(X, DY, row, stride, n_cols, BLOCK)
    tl.store(DG + row, a * rstd)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.)
    dx = g * rstd * (dy - x * rstd * rstd * a / n_cols)
    tl.store(DX + row * stride + cols, dx, mask=mask)


@triton.jit
def row_rms_scale_bwd_broken_partial_dg(X, G, DY, Rstd, DX, DG, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    rstd = tl.load(Rstd + row)
    g = tl.load(G + row)
    a = _row_dot(X, DY, row, stride, n_cols, BLOCK)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.)
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.)
    tl.store(DG + row, tl.sum(dy * x, axis=0) * rstd)  # BUG: this block's part of the row's sum
    dx = g * rstd * (dy - x * rstd * rstd * a / n_cols)
    tl.store(DX + row * stride + cols, dx, mask=mask)

"""Columns scaled by a weight, in f16, as a fused "scale" layer writes it: y = x * w[col].

The backward has two kernels: `col_scale_bwd_dx` (dx = dy * w, one tile of rows per program) and
`col_scale_bwd_dw` (dw[c] = sum over every row of dy * x, one block of columns per program,
looping over the rows with an f32 accumulator, stored in f16).

`col_scale_bwd_dw_broken_f16_acc` accumulates in f16: the formula is right, but 2000 additions
rounded to f16 each lose far more than f16's roundoff (the rounding line fails).
"""
import triton
import triton.language as tl


@triton.jit
def col_scale_fwd(X, W, Y, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(X + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.).to(tl.float32)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.).to(tl.float32)
    tl.store(Y + rows[:, None] * n_cols + cols[None, :], (x * w[None, :]).to(tl.float16), mask=mask)


@triton.jit
def col_scale_bwd_dx(DY, W, DX, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    dy = tl.load(DY + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.).to(tl.float32)
    w = tl.load(W + cols, mask=cols < n_cols, other=0.).to(tl.float32)
    tl.store(DX + rows[:, None] * n_cols + cols[None, :], (dy * w[None, :]).to(tl.float16), mask=mask)


@triton.jit
def col_scale_bwd_dw(X, DY, DW, n_rows, n_cols, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n_cols
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for r in range(0, n_rows):
        x = tl.load(X + r * n_cols + cols, mask=cmask, other=0.).to(tl.float32)
        dy = tl.load(DY + r * n_cols + cols, mask=cmask, other=0.).to(tl.float32)
        acc += dy * x
    tl.store(DW + cols, acc.to(tl.float16), mask=cmask)


@triton.jit
def col_scale_bwd_dw_broken_f16_acc(X, DY, DW, n_rows, n_cols, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < n_cols
    acc = tl.zeros([BLOCK_C], dtype=tl.float16)  # BUG: a 2000-term sum accumulated in f16
    for r in range(0, n_rows):
        x = tl.load(X + r * n_cols + cols, mask=cmask, other=0.).to(tl.float32)
        dy = tl.load(DY + r * n_cols + cols, mask=cmask, other=0.).to(tl.float32)
        acc += (dy * x).to(tl.float16)
    tl.store(DW + cols, acc, mask=cmask)

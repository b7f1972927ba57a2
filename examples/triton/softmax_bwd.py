"""Backward of softmax (y = softmax(x) along each row), from the saved output y:
grad_x = y * (grad_y - sum(grad_y * y, axis=1)).

`softmax_bwd` is correct; each `softmax_bwd_broken_*` differs from it in one line, marked with a
comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def softmax_bwd(y_ptr, grad_y_ptr, grad_x_ptr, y_row_stride, grad_y_row_stride, grad_x_row_stride, n_rows, n_cols,
                BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    y = tl.load(y_ptr + rows[:, None] * y_row_stride + cols[None, :], mask=mask, other=0.0)
    g = tl.load(grad_y_ptr + rows[:, None] * grad_y_row_stride + cols[None, :], mask=mask, other=0.0)
    dot = tl.sum(g * y, axis=1, keep_dims=True)
    grad_x = y * (g - dot)
    tl.store(grad_x_ptr + rows[:, None] * grad_x_row_stride + cols[None, :], grad_x, mask=mask)


@triton.jit
def softmax_bwd_broken_row_mask(y_ptr, grad_y_ptr, grad_x_ptr, y_row_stride, grad_y_row_stride, grad_x_row_stride,
                                n_rows, n_cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows + BLOCK_ROWS) & (cols[None, :] < n_cols)  # BUG: row bound padded to the tile, the last tile runs past n_rows
    y = tl.load(y_ptr + rows[:, None] * y_row_stride + cols[None, :], mask=mask, other=0.0)
    g = tl.load(grad_y_ptr + rows[:, None] * grad_y_row_stride + cols[None, :], mask=mask, other=0.0)
    dot = tl.sum(g * y, axis=1, keep_dims=True)
    grad_x = y * (g - dot)
    tl.store(grad_x_ptr + rows[:, None] * grad_x_row_stride + cols[None, :], grad_x, mask=mask)


@triton.jit
def softmax_bwd_broken_axis(y_ptr, grad_y_ptr, grad_x_ptr, y_row_stride, grad_y_row_stride, grad_x_row_stride,
                            n_rows, n_cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    y = tl.load(y_ptr + rows[:, None] * y_row_stride + cols[None, :], mask=mask, other=0.0)
    g = tl.load(grad_y_ptr + rows[:, None] * grad_y_row_stride + cols[None, :], mask=mask, other=0.0)
    dot = tl.sum(g * y, axis=0, keep_dims=True)  # BUG: reduces over rows (axis 0) instead of columns
    grad_x = y * (g - dot)
    tl.store(grad_x_ptr + rows[:, None] * grad_x_row_stride + cols[None, :], grad_x, mask=mask)


@triton.jit
def softmax_bwd_broken_no_dot(y_ptr, grad_y_ptr, grad_x_ptr, y_row_stride, grad_y_row_stride, grad_x_row_stride,
                              n_rows, n_cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    y = tl.load(y_ptr + rows[:, None] * y_row_stride + cols[None, :], mask=mask, other=0.0)
    g = tl.load(grad_y_ptr + rows[:, None] * grad_y_row_stride + cols[None, :], mask=mask, other=0.0)
    dot = tl.sum(g * y, axis=1, keep_dims=True)
    grad_x = y * g  # BUG: the row term - sum(grad_y * y) is dropped (elementwise derivative only)
    tl.store(grad_x_ptr + rows[:, None] * grad_x_row_stride + cols[None, :], grad_x, mask=mask)


@triton.jit
def softmax_bwd_broken_row_step(y_ptr, grad_y_ptr, grad_x_ptr, y_row_stride, grad_y_row_stride, grad_x_row_stride,
                                n_rows, n_cols, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + 2 * tl.arange(0, BLOCK_ROWS)  # BUG: rows two apart, the odd rows are never written
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    y = tl.load(y_ptr + rows[:, None] * y_row_stride + cols[None, :], mask=mask, other=0.0)
    g = tl.load(grad_y_ptr + rows[:, None] * grad_y_row_stride + cols[None, :], mask=mask, other=0.0)
    dot = tl.sum(g * y, axis=1, keep_dims=True)
    grad_x = y * (g - dot)
    tl.store(grad_x_ptr + rows[:, None] * grad_x_row_stride + cols[None, :], grad_x, mask=mask)

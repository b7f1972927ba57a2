import triton
import triton.language as tl


@triton.jit
def softmax(x_ptr, y_ptr, x_row_stride, y_row_stride, n_rows, n_cols,
            BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    tl.static_assert(BLOCK_COLS >= 1)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=-float("inf"))
    z = x - tl.max(x, axis=1, keep_dims=True)
    num = tl.exp(z)
    y = num / tl.sum(num, axis=1, keep_dims=True)
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], y, mask=mask)

"""Cross entropy with ignore_index in the style of fused-loss libraries: one row of logits per
program; a row whose label is `ignore_index` stores a zero loss and returns early; `reduction`
is a string constexpr ("mean" divides each row's loss by `n_rows`, "sum" does not).

    loss[r] = logsumexp(x[r, :]) - x[r, y[r]]    (0 where y[r] == ignore_index)
"""
import triton
import triton.language as tl


@triton.jit
def liger_cross_entropy_fwd_kernel(
    X_ptr,
    X_stride,
    Y_ptr,
    loss_ptr,
    n_cols,
    n_rows,
    ignore_index,
    reduction: tl.constexpr = "mean",
    BLOCK_SIZE: tl.constexpr = 1024,
):
    program_id = tl.program_id(0).to(tl.int64)
    y = tl.load(Y_ptr + program_id)
    if y == ignore_index:
        tl.store(loss_ptr + program_id, 0.0)
        return

    X_ptr += program_id * X_stride
    m = float("-inf")
    d = 0.0
    # Online logsumexp over blocks of columns.
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        block_max = tl.max(X_block)
        m_new = max(m, block_max)
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(X_block - m_new))
        m = m_new
    lse = m + tl.log(d)
    X_y = tl.load(X_ptr + y).to(tl.float32)
    loss = lse - X_y
    if reduction == "mean":
        loss = loss / n_rows
    tl.store(loss_ptr + program_id, loss)

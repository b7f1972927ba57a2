"""Cross entropy whose forward also computes the gradient, in the style of fused-loss libraries:
one row of logits per program; after the loss, a second pass over the row leaves d(loss)/d(x)
of the mean loss in `DX` (a buffer the backward then scales by the upstream gradient, in place).
Rows labelled `ignore_index` store a zero loss and leave their gradient row as allocated (zeros).

    loss[r] = (logsumexp(x[r, :]) - x[r, y[r]]) / n_non_ignore
    dx[r, c] = (softmax(x[r, :])[c] - (c == y[r])) / n_non_ignore

`cross_entropy_fwd_grad_kernel_broken_*` differ from their correct kernel in one line, marked
`# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def cross_entropy_fwd_grad_kernel(
    X_ptr,
    X_stride,
    DX_ptr,
    DX_stride,
    Y_ptr,
    loss_ptr,
    n_cols,
    n_non_ignore,
    ignore_index,
    BLOCK_SIZE: tl.constexpr,
):
    program_id = tl.program_id(0).to(tl.int64)
    y = tl.load(Y_ptr + program_id)
    if y == ignore_index:
        tl.store(loss_ptr + program_id, 0.0)
        return
    X_ptr += program_id * X_stride
    DX_ptr += program_id * DX_stride
    m = float("-inf")
    d = 0.0
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        m_new = max(m, tl.max(X_block))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(X_block - m_new))
        m = m_new
    # The gradient, left in DX for the backward.
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        p = tl.exp(X_block - m) / d
        dx = tl.where(X_offsets != y, p / n_non_ignore, (p - 1.0) / n_non_ignore)
        tl.store(DX_ptr + X_offsets, dx, mask=X_offsets < n_cols)
    X_y = tl.load(X_ptr + y).to(tl.float32)
    loss = (m + tl.log(d) - X_y) / n_non_ignore
    tl.store(loss_ptr + program_id, loss)


@triton.jit
def cross_entropy_fwd_grad_kernel_broken_precedence(
    X_ptr,
    X_stride,
    DX_ptr,
    DX_stride,
    Y_ptr,
    loss_ptr,
    n_cols,
    n_non_ignore,
    ignore_index,
    BLOCK_SIZE: tl.constexpr,
):
    program_id = tl.program_id(0).to(tl.int64)
    y = tl.load(Y_ptr + program_id)
    if y == ignore_index:
        tl.store(loss_ptr + program_id, 0.0)
        return
    X_ptr += program_id * X_stride
    DX_ptr += program_id * DX_stride
    m = float("-inf")
    d = 0.0
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        m_new = max(m, tl.max(X_block))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(X_block - m_new))
        m = m_new
    # The gradient, left in DX for the backward.
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        p = tl.exp(X_block - m) / d
        dx = tl.where(X_offsets != y, p / n_non_ignore, p - 1.0 / n_non_ignore)  # BUG: (p - 1.0) / n intended
        tl.store(DX_ptr + X_offsets, dx, mask=X_offsets < n_cols)
    X_y = tl.load(X_ptr + y).to(tl.float32)
    loss = (m + tl.log(d) - X_y) / n_non_ignore
    tl.store(loss_ptr + program_id, loss)

"""Backward of cross_entropy.py: for a row with label y (not ignore_index) and upstream gradient g,

    grad_x[r, :] = (softmax(x[r, :]) - onehot(y)) * g    (divided by n_rows for "mean")

and zeros for an ignored row (which returns early). Two passes over the row: the online max and
normaliser, then the gradient block by block.

`*_broken_*` variants differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def liger_cross_entropy_bwd_kernel(
    X_ptr,
    X_stride,
    dX_ptr,
    dX_stride,
    Y_ptr,
    dloss_ptr,
    n_cols,
    n_rows,
    ignore_index,
    reduction: tl.constexpr = "mean",
    BLOCK_SIZE: tl.constexpr = 1024,
):
    program_id = tl.program_id(0).to(tl.int64)
    y = tl.load(Y_ptr + program_id)
    X_ptr += program_id * X_stride
    dX_ptr += program_id * dX_stride
    if y == ignore_index:
        for i in range(0, n_cols, BLOCK_SIZE):
            X_offsets = i + tl.arange(0, BLOCK_SIZE)
            tl.store(dX_ptr + X_offsets, 0.0, mask=X_offsets < n_cols)
        return

    m = float("-inf")
    d = 0.0
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        m_new = max(m, tl.max(X_block))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(X_block - m_new))
        m = m_new
    g = tl.load(dloss_ptr + program_id)
    if reduction == "mean":
        g = g / n_rows
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        p = tl.exp(X_block - m) / d
        p = tl.where(X_offsets == y, p - 1.0, p)
        tl.store(dX_ptr + X_offsets, p * g, mask=X_offsets < n_cols)


@triton.jit
def liger_cross_entropy_bwd_kernel_broken_ignored(
    X_ptr,
    X_stride,
    dX_ptr,
    dX_stride,
    Y_ptr,
    dloss_ptr,
    n_cols,
    n_rows,
    ignore_index,
    reduction: tl.constexpr = "mean",
    BLOCK_SIZE: tl.constexpr = 1024,
):
    program_id = tl.program_id(0).to(tl.int64)
    y = tl.load(Y_ptr + program_id)
    X_ptr += program_id * X_stride
    dX_ptr += program_id * dX_stride
    if y == ignore_index:
        return  # BUG: leaves the ignored row of grad_x unwritten

    m = float("-inf")
    d = 0.0
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        m_new = max(m, tl.max(X_block))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(X_block - m_new))
        m = m_new
    g = tl.load(dloss_ptr + program_id)
    if reduction == "mean":
        g = g / n_rows
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        p = tl.exp(X_block - m) / d
        p = tl.where(X_offsets == y, p - 1.0, p)
        tl.store(dX_ptr + X_offsets, p * g, mask=X_offsets < n_cols)


@triton.jit
def liger_cross_entropy_bwd_kernel_broken_reduction(
    X_ptr,
    X_stride,
    dX_ptr,
    dX_stride,
    Y_ptr,
    dloss_ptr,
    n_cols,
    n_rows,
    ignore_index,
    reduction: tl.constexpr = "mean",
    BLOCK_SIZE: tl.constexpr = 1024,
):
    program_id = tl.program_id(0).to(tl.int64)
    y = tl.load(Y_ptr + program_id)
    X_ptr += program_id * X_stride
    dX_ptr += program_id * dX_stride
    if y == ignore_index:
        for i in range(0, n_cols, BLOCK_SIZE):
            X_offsets = i + tl.arange(0, BLOCK_SIZE)
            tl.store(dX_ptr + X_offsets, 0.0, mask=X_offsets < n_cols)
        return

    m = float("-inf")
    d = 0.0
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        m_new = max(m, tl.max(X_block))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(X_block - m_new))
        m = m_new
    g = tl.load(dloss_ptr + program_id)
    if reduction == "sum":  # BUG: tests the wrong reduction, so "mean" is not divided by n_rows
        g = g / n_rows
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).to(tl.float32)
        p = tl.exp(X_block - m) / d
        p = tl.where(X_offsets == y, p - 1.0, p)
        tl.store(dX_ptr + X_offsets, p * g, mask=X_offsets < n_cols)

"""Sums of squares of rows, the forward walking each row with a pointer it advances in its loop
(`p += BLOCK`), the idiom of Triton's tutorials; the backward indexes by offsets.

    y[r] = sum over c of x[r, c]^2;  dx[r, c] = 2 * x[r, c] * dy[r]

`row_sq_sum_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def row_sq_sum_fwd(X, Y, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    p = X + pid * n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, n, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        x = tl.load(p + tl.arange(0, BLOCK), mask=cols < n, other=0.0)
        acc += x * x
        p += BLOCK
    tl.store(Y + pid, tl.sum(acc, axis=0))


@triton.jit
def row_sq_sum_bwd(X, DY, DX, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.load(DY + pid)
    for c0 in range(0, n, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(X + pid * n + cols, mask=m, other=0.0)
        tl.store(DX + pid * n + cols, 2.0 * x * g, mask=m)


@triton.jit
def row_sq_sum_bwd_broken_factor(X, DY, DX, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.load(DY + pid)
    for c0 in range(0, n, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(X + pid * n + cols, mask=m, other=0.0)
        tl.store(DX + pid * n + cols, x * g, mask=m)  # BUG: the factor 2 is missing


@triton.jit
def row_sq_sum_bwd_broken_last_chunk(X, DY, DX, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.load(DY + pid)
    for c0 in range(0, n - BLOCK, BLOCK):  # BUG: the last chunk of each row is skipped
        cols = c0 + tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(X + pid * n + cols, mask=m, other=0.0)
        tl.store(DX + pid * n + cols, 2.0 * x * g, mask=m)

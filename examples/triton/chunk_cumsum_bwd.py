"""Backward of chunk_cumsum.py: a reversed cumulative sum in chunks from the row's end, each chunk
adding the total of the chunks after it, read back from the next chunk's first output with a
conditional expression that only runs for chunks that have a next one.

`chunk_cumsum_bwd_broken_*` differ in one line each, marked with a comment.
"""
import triton
import triton.language as tl


@triton.jit
def chunk_cumsum_bwd(DY, DX, T, BT: tl.constexpr):
    row = tl.program_id(0)
    n = tl.cdiv(T, BT)
    for k in range(0, n):
        c = n - 1 - k
        offs = c * BT + tl.arange(0, BT)
        m = offs < T
        dy = tl.load(DY + row * T + offs, mask=m, other=0.)
        nxt = tl.load(DX + row * T + (c + 1) * BT) if c < n - 1 else 0.
        tl.store(DX + row * T + offs, tl.cumsum(dy, axis=0, reverse=True) + nxt, mask=m)


@triton.jit
def chunk_cumsum_bwd_broken_guard(DY, DX, T, BT: tl.constexpr):
    row = tl.program_id(0)
    n = tl.cdiv(T, BT)
    for k in range(0, n):
        c = n - 1 - k
        offs = c * BT + tl.arange(0, BT)
        m = offs < T
        dy = tl.load(DY + row * T + offs, mask=m, other=0.)
        nxt = tl.load(DX + row * T + (c + 1) * BT) if c < n else 0.  # BUG: the last chunk has no next one
        tl.store(DX + row * T + offs, tl.cumsum(dy, axis=0, reverse=True) + nxt, mask=m)


@triton.jit
def chunk_cumsum_bwd_broken_carry(DY, DX, T, BT: tl.constexpr):
    row = tl.program_id(0)
    n = tl.cdiv(T, BT)
    for k in range(0, n):
        c = n - 1 - k
        offs = c * BT + tl.arange(0, BT)
        m = offs < T
        dy = tl.load(DY + row * T + offs, mask=m, other=0.)
        nxt = tl.load(DX + row * T + (c + 1) * BT + 1) if c < n - 1 else 0.  # BUG: the next chunk's second total
        tl.store(DX + row * T + offs, tl.cumsum(dy, axis=0, reverse=True) + nxt, mask=m)


@triton.jit
def chunk_cumsum_bwd_broken_last_guard(DY, DX, T, BT: tl.constexpr):
    row = tl.program_id(0)
    n = tl.cdiv(T, BT)
    for k in range(0, n):
        c = n - 1 - k
        offs = c * BT + tl.arange(0, BT)
        m = offs < T
        dy = tl.load(DY + row * T + offs, mask=m, other=0.)
        nxt = tl.load(DX + row * T + (c + 1) * BT) if c < n - 2 else 0.  # BUG: off by one, the chunk before the last adds no total
        tl.store(DX + row * T + offs, tl.cumsum(dy, axis=0, reverse=True) + nxt, mask=m)

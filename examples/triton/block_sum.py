"""A two-stage sum, as launchers write it: each program sums one block of `x` into a buffer of
partial sums, which the host adds up. The backward broadcasts the output's cotangent.

The launcher must allocate one partial sum per program, `cdiv(n, BLOCK)`; one that allocates
`n // BLOCK` (see ../defects/block_sum_short_partials.toml) has its last program store past the end of the
buffer: a defect of the forward, which the check reports as a failure (exit 1).
"""
import triton
import triton.language as tl


@triton.jit
def block_sum_fwd(X, Partials, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n, other=0.)
    tl.store(Partials + pid, tl.sum(x, axis=0))


@triton.jit
def block_sum_bwd(DOut, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(DOut)
    tl.store(DX + offs, tl.zeros([BLOCK], dtype=tl.float32) + g, mask=offs < n)


@triton.jit
def block_sum_bwd_broken_tail(DOut, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(DOut)
    tl.store(DX + offs, tl.zeros([BLOCK], dtype=tl.float32) + g, mask=offs < n - 1)  # BUG: leaves the last element unwritten

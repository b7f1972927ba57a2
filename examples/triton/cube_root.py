"""Cube roots by Newton's iteration in place: the forward stores a first guess, then a `while`
loop reads the guesses back, improves them and stores them again until the largest step of the
block is below TOL. The backward reads the roots it left.

    y = x^(1/3);  dx = dy / (3 y^2)

`cube_root_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def cube_root_fwd(X, Y, n, TOL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=1.0)
    tl.store(Y + offs, 0.5 + x / 3.0, mask=m)
    step = TOL + 1.0
    while step > TOL:
        y = tl.load(Y + offs, mask=m, other=1.0)
        y_new = y - (y * y * y - x) / (3.0 * y * y)
        step = tl.max(tl.abs(y_new - y), axis=0)
        tl.store(Y + offs, y_new, mask=m)


@triton.jit
def cube_root_bwd(Y, DY, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.load(Y + offs, mask=m, other=1.0)
    dy = tl.load(DY + offs, mask=m, other=0.0)
    tl.store(DX + offs, dy / (3.0 * y * y), mask=m)


@triton.jit
def cube_root_bwd_broken_factor(Y, DY, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    y = tl.load(Y + offs, mask=m, other=1.0)
    dy = tl.load(DY + offs, mask=m, other=0.0)
    tl.store(DX + offs, dy / (y * y), mask=m)  # BUG: the factor 3 is missing


@triton.jit
def cube_root_bwd_broken_mask(Y, DY, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n - 1  # BUG: the last element is masked off
    y = tl.load(Y + offs, mask=m, other=1.0)
    dy = tl.load(DY + offs, mask=m, other=0.0)
    tl.store(DX + offs, dy / (3.0 * y * y), mask=m)

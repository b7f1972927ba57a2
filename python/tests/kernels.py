"""Small Triton kernels for the package's tests (views, aliasing, host code, numpy)."""

import triton
import triton.language as tl


@triton.jit
def square(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x, mask=mask)


@triton.jit
def square_bwd(x_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    gy = tl.load(gy_ptr + offs, mask=mask)
    tl.store(gx_ptr + offs, 2.0 * x * gy, mask=mask)


@triton.jit
def square_bwd_wrong(x_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    gy = tl.load(gy_ptr + offs, mask=mask)
    tl.store(gx_ptr + offs, x * gy, mask=mask)  # the factor 2 is missing


@triton.jit
def square_bwd_unmasked(x_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    gy = tl.load(gy_ptr + offs, mask=mask)
    tl.store(gx_ptr + offs, 2.0 * x * gy)  # no mask: out of bounds in the last program


@triton.jit
def scale_rows(x_ptr, y_ptr, rows, cols, sxr, sxc, syr, syc, factor, BLOCK: tl.constexpr):
    """y[r, c] = factor * x[r, c] for strided 2-D views, one row per program."""
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    mask = c < cols
    x = tl.load(x_ptr + r * sxr + c * sxc, mask=mask)
    tl.store(y_ptr + r * syr + c * syc, factor * x, mask=mask)


@triton.jit
def add_into(acc_ptr, x_ptr, n, BLOCK: tl.constexpr):
    """acc += x (in place)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(acc_ptr + offs, mask=mask)
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(acc_ptr + offs, a + x, mask=mask)


@triton.jit
def mul(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.heuristics({"BLOCK": lambda args: 64 if args["n"] < 1000 else 128})
@triton.jit
def square_heuristic(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 128})], key=["n"])
@triton.jit
def square_autotuned(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x, mask=mask)


@triton.jit
def row_max_sum(x_ptr, out_ptr, total_ptr, cols, BLOCK: tl.constexpr):
    """out[r] = the sum over lanes of the running max of row r's column blocks (lane c % BLOCK),
    one row per program; total += out[r] atomically."""
    r = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32) - float("inf")
    for start in range(0, cols, BLOCK):
        c = start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + r * cols + c, mask=c < cols, other=-float("inf"))
        acc = tl.maximum(acc, v)
    s = tl.sum(acc, axis=0)
    tl.store(out_ptr + r, s)
    tl.atomic_add(total_ptr, s)


@triton.jit
def row_sum_tail(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    # The row's tail is loaded without `other`: right on Triton's GPU backends (the masked-off
    # lanes read 0), noted by a check.
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offs, mask=offs < cols)
    tl.store(out_ptr + row, tl.sum(x, axis=0))


@triton.jit
def row_broadcast(g_ptr, gx_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    g = tl.load(g_ptr + row)
    tl.store(gx_ptr + row * cols + offs, tl.zeros((BLOCK,), dtype=tl.float32) + g, mask=offs < cols)

"""Kernels for test_surface.py: constexprs of every kind, optional pointers passed as None, an
autotuned backward whose bug shows in one config only, and f16 kernels for calibrated tolerances."""

import triton
import triton.language as tl


@triton.jit
def scaled_act(x_ptr, b_ptr, y_ptr, n, eps: tl.constexpr, ACT: tl.constexpr, reduction: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if b_ptr is not None:
        x += tl.load(b_ptr + offs, mask=mask, other=0.0)
    if ACT == "leaky_relu":
        y = tl.where(x > 0, x, 0.01 * x)
    elif ACT is None:
        y = x
    else:
        y = x * x
    y = y / (1.0 + eps)
    if reduction == "mean":
        y = y / n
    tl.store(y_ptr + offs, y.to(OUT), mask=mask)


@triton.jit
def scaled_act_bwd(x_ptr, b_ptr, gy_ptr, gx_ptr, n, eps: tl.constexpr, ACT: tl.constexpr, reduction: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if b_ptr is not None:
        x += tl.load(b_ptr + offs, mask=mask, other=0.0)
    g = tl.load(gy_ptr + offs, mask=mask, other=0.0).to(tl.float32) / (1.0 + eps)
    if reduction == "mean":
        g = g / n
    if ACT == "leaky_relu":
        g = tl.where(x > 0, g, 0.01 * g)
    elif ACT is None:
        g = g
    else:
        g = 2.0 * x * g
    tl.store(gx_ptr + offs, g.to(gx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def scale(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (x * factor).to(y_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})], key=["n"])
@triton.jit
def scale_bwd_unmasked(gy_ptr, gx_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(gy_ptr + offs)  # no mask: right only when BLOCK divides n
    tl.store(gx_ptr + offs, g * factor)


@triton.jit
def scale_bwd_f16(gy_ptr, gx_ptr, n, factor, skew, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gy_ptr + offs, mask=mask).to(tl.float32)
    tl.store(gx_ptr + offs, (g * factor * skew).to(tl.float16), mask=mask)


@triton.jit
def sqrt_fwd(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.sqrt(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def sqrt_bwd(x_ptr, gy_ptr, gx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    g = tl.load(gy_ptr + offs, mask=mask)
    tl.store(gx_ptr + offs, 0.5 * g / tl.sqrt(x), mask=mask)


@triton.jit
def row_scale(x_ptr, w_ptr, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    tl.store(y_ptr + row * n_cols + cols, (x * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_scale_bwd(x_ptr, w_ptr, gy_ptr, gx_ptr, dw_part_ptr, n_rows, n_cols, rows_per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for r in range(pid * rows_per_program, tl.minimum((pid + 1) * rows_per_program, n_rows)):
        gy = tl.load(gy_ptr + r * n_cols + cols, mask=mask).to(tl.float32)
        x = tl.load(x_ptr + r * n_cols + cols, mask=mask).to(tl.float32)
        tl.store(gx_ptr + r * n_cols + cols, (gy * w).to(gx_ptr.dtype.element_ty), mask=mask)
        dw += gy * x
    tl.store(dw_part_ptr + pid * n_cols + cols, dw, mask=mask)

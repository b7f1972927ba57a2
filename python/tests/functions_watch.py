"""Autograd Functions for the tests of given cotangents and in-place Functions
(test_function_rules.py) and of `tilegrad.watch` (test_watch.py): a column scale whose
backward is right, and variants right only for some cotangents (ones; contiguous ones); an
in-place exp that records the inputs its forward saw; a Function of torch code alone; a
doubling whose autotuned backward is right in its first config only."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels_surface as KS


@triton.jit
def scale_fwd(Y, X, W, n_rows, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(Y + row * n_cols + cols, x * w, mask=mask)


@triton.jit
def scale_bwd(DX, DW_ROWS, DY, X, W, stride_dy_row, stride_dy_col, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride_dy_row + cols * stride_dy_col, mask=mask, other=0.0)
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(DX + row * n_cols + cols, dy * w, mask=mask)
    tl.store(DW_ROWS + row * n_cols + cols, dy * x, mask=mask)


@triton.jit
def scale_bwd_ones(DX, DW_ROWS, DY, X, W, stride_dy_row, stride_dy_col, n_cols, BLOCK: tl.constexpr):
    """The gradient for a cotangent of ones: DY is never read."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    tl.store(DX + row * n_cols + cols, w, mask=mask)
    tl.store(DW_ROWS + row * n_cols + cols, x, mask=mask)


class Scale(torch.autograd.Function):
    """`Scale.apply(x, w)`: x (rows, cols) times w (cols,), row by row. Its backward reads the
    cotangent through its strides (`dy_strides`)."""

    bwd_kernel = scale_bwd

    @staticmethod
    def forward(ctx, x, w):
        x = x.contiguous()
        y = torch.empty_like(x)
        scale_fwd[(x.shape[0],)](y, x, w, x.shape[0], x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        ctx.save_for_backward(x, w)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = torch.empty_like(x)
        dw_rows = torch.empty_like(x)
        fn = type(ctx)._forward_cls
        fn.bwd_kernel[(x.shape[0],)](dx, dw_rows, dy, x, w, *fn.dy_strides(dy), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return dx, dw_rows.sum(0)

    @staticmethod
    def dy_strides(dy: torch.Tensor) -> tuple[int, int]:
        return dy.stride(0), dy.stride(1)


class ScaleForOnes(Scale):
    """Right only where the cotangent is all ones (as `y.sum()` gives)."""

    bwd_kernel = scale_bwd_ones


class ScaleForContiguous(Scale):
    """Right only where the cotangent is contiguous: it reads it with a row-major layout's
    strides, as a launcher that forgot `dy.contiguous()` does."""

    @staticmethod
    def dy_strides(dy: torch.Tensor) -> tuple[int, int]:
        return dy.shape[1], 1


class ScaleDrawingSeed(Scale):
    """Draws from torch's generator in its forward, as a fused dropout draws its seed (here for
    a dropout of probability 0)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.seed = int(torch.randint(0, 2**31 - 1, ()))
        return Scale.forward(ctx, x, w)


@triton.jit
def exp_in_place(X, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(X + offs, tl.exp(tl.load(X + offs, mask=mask)), mask=mask)


@triton.jit
def mul_kernel(OUT, A, B, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(OUT + offs, tl.load(A + offs, mask=mask) * tl.load(B + offs, mask=mask), mask=mask)


class ExpInPlace(torch.autograd.Function):
    """`x.exp_()` by a kernel, marked dirty; every forward appends a copy of the input it got to
    `seen`."""

    seen: list[torch.Tensor] = []

    @staticmethod
    def forward(ctx, x):
        ExpInPlace.seen.append(x.detach().clone())
        n = x.numel()
        exp_in_place[(triton.cdiv(n, 64),)](x, n, BLOCK=64)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = torch.empty_like(y)
        n = y.numel()
        mul_kernel[(triton.cdiv(n, 64),)](dx, dy.contiguous(), y, n, BLOCK=64)
        return dx


class TorchOnly(torch.autograd.Function):
    """A Function of torch code alone: not watched."""

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, dy):
        return dy * 3


class ExpInPlaceForgetsExp(ExpInPlace):
    """Broken: the gradient of the identity."""

    @staticmethod
    def backward(ctx, dy):
        return dy.clone()


class DoubleAutotuned(torch.autograd.Function):
    """`2 * x` (1-D); its backward kernel is autotuned and unmasked: right where its BLOCK (128,
    then 256) divides the length."""

    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        KS.scale[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), 2.0, BLOCK=128)
        return y

    @staticmethod
    def backward(ctx, dy):
        dy = dy.contiguous()
        dx = torch.empty_like(dy)
        n = dy.numel()
        KS.scale_bwd_unmasked[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](dy, dx, n, 2.0)
        return dx

"""Library-style autograd Functions for the report's blame tests: a row norm whose backward
writes per-program partial weight-gradient rows that the host sums, and broken variants (a wrong
kernel line, a wrong host line), each marked `# BUG:` on the line at fault."""

import torch
import triton
import triton.language as tl


@triton.jit
def _row_norm_fwd(X, W, Y, R, stride, n_cols, eps, BLOCK: tl.constexpr):
    """Y[i] = X[i] * W / rms(X[i]); R[i] = 1 / rms(X[i])."""
    i = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + i * stride + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(R + i, inv)
    tl.store(Y + i * stride + cols, x * inv * w, mask=mask)


@triton.jit
def _row_norm_bwd(DY, X, W, R, DX, DWP, stride, n_rows, n_cols, per_prog, BLOCK: tl.constexpr):
    """Rows [p * per_prog, (p + 1) * per_prog) of DX; row p of the partial weight gradient DWP."""
    p = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(p * per_prog, tl.minimum((p + 1) * per_prog, n_rows)):
        x = tl.load(X + i * stride + cols, mask=mask, other=0.0)
        dy = tl.load(DY + i * stride + cols, mask=mask, other=0.0)
        inv = tl.load(R + i)
        xh = x * inv
        g = dy * w
        dot = tl.sum(g * xh, axis=0) / n_cols
        dx = (g - xh * dot) * inv
        tl.store(DX + i * stride + cols, dx, mask=mask)
        dw += dy * xh
    tl.store(DWP + p * n_cols + cols, dw, mask=mask)


@triton.jit
def _row_norm_bwd_bad_dw(DY, X, W, R, DX, DWP, stride, n_rows, n_cols, per_prog, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(p * per_prog, tl.minimum((p + 1) * per_prog, n_rows)):
        x = tl.load(X + i * stride + cols, mask=mask, other=0.0)
        dy = tl.load(DY + i * stride + cols, mask=mask, other=0.0)
        inv = tl.load(R + i)
        xh = x * inv
        g = dy * w
        dot = tl.sum(g * xh, axis=0) / n_cols
        dx = (g - xh * dot) * inv
        tl.store(DX + i * stride + cols, dx, mask=mask)
        dw += dy * x  # BUG: dw: x instead of the normalised x
    tl.store(DWP + p * n_cols + cols, dw, mask=mask)


@triton.jit
def _row_norm_bwd_bad_dx(DY, X, W, R, DX, DWP, stride, n_rows, n_cols, per_prog, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(p * per_prog, tl.minimum((p + 1) * per_prog, n_rows)):
        x = tl.load(X + i * stride + cols, mask=mask, other=0.0)
        dy = tl.load(DY + i * stride + cols, mask=mask, other=0.0)
        inv = tl.load(R + i)
        xh = x * inv
        g = dy * w
        dot = tl.sum(g * xh, axis=0) / n_cols
        dx = (g - xh * dot) * inv * inv  # BUG: dx: scaled by the inverse rms twice
        tl.store(DX + i * stride + cols, dx, mask=mask)
        dw += dy * xh
    tl.store(DWP + p * n_cols + cols, dw, mask=mask)


class RowNorm(torch.autograd.Function):
    """y = x * w / rms(x) per row; the weight gradient summed on the host from per-program rows."""

    bwd_kernel = _row_norm_bwd
    programs = 5

    @staticmethod
    def forward(ctx, x, w):
        rows, cols = x.shape
        y = torch.empty_like(x)
        r = torch.empty(rows, dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(cols)
        _row_norm_fwd[(rows,)](x, w, y, r, x.stride(0), cols, 1e-6, BLOCK=block)
        ctx.save_for_backward(x, w, r)
        return y

    @classmethod
    def _partials(cls, dy, x, w, r):
        rows, cols = x.shape
        progs = min(cls.programs, rows)
        per = triton.cdiv(rows, progs)
        dx = torch.empty_like(x)
        part = torch.empty((progs, cols), dtype=torch.float32, device=x.device)
        cls.bwd_kernel[(progs,)](dy, x, w, r, dx, part, x.stride(0), rows, cols, per, BLOCK=triton.next_power_of_2(cols))
        return dx, part

    @staticmethod
    def _reduce(part):
        dw = part.sum(0)  # HOST: the weight gradient
        return dw

    @classmethod
    def backward(cls, ctx, dy):
        x, w, r = ctx.saved_tensors
        dx, part = cls._partials(dy.contiguous(), x, w, r)
        return dx, cls._reduce(part)


class RowNormBadDw(RowNorm):
    bwd_kernel = _row_norm_bwd_bad_dw


class RowNormBadDx(RowNorm):
    bwd_kernel = _row_norm_bwd_bad_dx


class RowNormBadHost(RowNorm):
    @staticmethod
    def _reduce(part):
        dw = part.sum(0) * 2  # BUG: host: the sum doubled
        return dw


@triton.jit
def _scale_fwd(X, Y, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(Y + offs, tl.load(X + offs, mask=mask) * s, mask=mask)  # STORE: scaled


@triton.jit
def _scale_bwd(DY, DX, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(DY + offs, mask=mask)
    tl.store(DX + offs, dy * s + 1.0, mask=mask)  # BUG: kernel: a constant added


class Triple(torch.autograd.Function):
    """y = 3 x by a kernel; the backward keeps an unused `torch.empty(1)` (never written, NaN)
    and computes the gradient on the host."""

    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        _scale_fwd[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), 3.0, BLOCK=128)
        return y

    @staticmethod
    def backward(ctx, dy):
        dummy = torch.empty(1, dtype=torch.float32, device=dy.device)  # noqa: F841 - unused, as libraries keep one
        dx = dy * 3.0
        return dx


class TripleBadHost(Triple):
    @staticmethod
    def backward(ctx, dy):
        dummy = torch.empty(1, dtype=torch.float32, device=dy.device)  # noqa: F841
        dx = dy * 2.0  # BUG: host: the factor is 3
        return dx


class TripleBadKernel(Triple):
    """The gradient by a kernel, with the unused dummy."""

    @staticmethod
    def backward(ctx, dy):
        dummy = torch.empty(1, dtype=torch.float32, device=dy.device)  # noqa: F841
        dx = torch.empty_like(dy)
        _scale_bwd[(triton.cdiv(dy.numel(), 128),)](dy, dx, dy.numel(), 3.0, BLOCK=128)
        return dx


class TripleInPlace(Triple):
    """The gradient by a kernel, then scaled in place on the host."""

    @staticmethod
    def backward(ctx, dy):
        dx = torch.empty_like(dy)
        _scale_fwd[(triton.cdiv(dy.numel(), 128),)](dy, dx, dy.numel(), 1.0, BLOCK=128)
        dx.mul_(3.0)
        dx[7:11] += 1.0  # BUG: in place: a slice shifted
        return dx


@triton.jit
def _accumulate_bwd(DY, DX, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(DY + offs, mask=mask)
    acc = tl.load(DX + offs, mask=mask)  # BUG: nan: reads the gradient before writing it
    tl.store(DX + offs, acc + dy * s, mask=mask)

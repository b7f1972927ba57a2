"""Autograd Functions written as Triton kernel libraries write them, for the checks of PyTorch's
rules (test_function_rules.py): a row-normalisation whose weight gradient is summed on the host
from per-row partials, a backward that overwrites its `grad_output`, a forward that computes its
input's gradient in place only when the input requires grad, `None` gradients for inputs that
are not differentiable (rotation tables, targets), keyword arguments, an output marked
non-differentiable. Each has a broken variant: a scaled weight gradient in a subclass, or a
swapped kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def rms_norm_fwd(X, Y, W, RSTD, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    tl.store(Y + row * stride + cols, x * rstd * w, mask=mask)


@triton.jit
def rms_norm_bwd(DY, DX, X, W, RSTD, DW, stride, n_cols, BLOCK: tl.constexpr):
    """dX of one row (DX may be DY: the row is read before it is written) and the row's
    partial dW."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    rstd = tl.load(RSTD + row)
    m = dy * w
    dx = rstd * m - rstd * rstd * rstd / n_cols * tl.sum(m * x, axis=0) * x
    tl.store(DX + row * stride + cols, dx, mask=mask)
    tl.store(DW + row * stride + cols, dy * x * rstd, mask=mask)


@triton.jit
def rms_norm_bwd_no_mean(DY, DX, X, W, RSTD, DW, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(DY + row * stride + cols, mask=mask, other=0.0)
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(W + cols, mask=mask, other=0.0)
    rstd = tl.load(RSTD + row)
    tl.store(DX + row * stride + cols, rstd * dy * w, mask=mask)  # the mean's term is missing
    tl.store(DW + row * stride + cols, dy * x * rstd, mask=mask)


class RMSNorm(torch.autograd.Function):
    """y = x / rms(x) * w over the last axis; `in_place`: dX overwrites dY."""

    bwd_kernel = rms_norm_bwd

    @staticmethod
    def forward(ctx, X, W, eps=1e-6, in_place=True):
        shape = X.shape
        X = X.reshape(-1, shape[-1])
        rows, cols = X.shape
        Y = torch.empty_like(X)
        rstd = torch.empty(rows, dtype=torch.float32, device=X.device)
        rms_norm_fwd[(rows,)](X, Y, W, rstd, X.stride(0), cols, eps, BLOCK=triton.next_power_of_2(cols))
        ctx.in_place = in_place
        ctx.save_for_backward(X, W, rstd)
        return Y.view(*shape)

    @staticmethod
    def backward(ctx, dY):
        X, W, rstd = ctx.saved_tensors
        shape = dY.shape
        dY = dY.reshape(-1, shape[-1]).contiguous()
        rows, cols = dY.shape
        dX = dY if ctx.in_place else torch.empty_like(dY)
        _dW = torch.empty((rows, cols), dtype=torch.float32, device=W.device)
        type(ctx)._forward_cls.bwd_kernel[(rows,)](dY, dX, X, W, rstd, _dW, X.stride(0), cols, BLOCK=triton.next_power_of_2(cols))
        return dX.view(*shape), type(ctx)._forward_cls.weight_grad(_dW), None, None

    @staticmethod
    def weight_grad(partial: torch.Tensor) -> torch.Tensor:
        return partial.sum(0).to(torch.float32)


class RMSNormScaledDW(RMSNorm):
    @staticmethod
    def weight_grad(partial):
        return 2 * partial.sum(0)


class RMSNormNoMean(RMSNorm):
    bwd_kernel = rms_norm_bwd_no_mean


class RMSNormKeepDim(RMSNorm):
    """dW of shape (1, cols) for W of (cols,): torch sums it to W's shape."""

    @staticmethod
    def weight_grad(partial):
        return partial.sum(0, keepdim=True)


class RMSNormBadShape(RMSNorm):
    """dW one element too long: torch rejects it."""

    @staticmethod
    def weight_grad(partial):
        return torch.cat([partial.sum(0), partial.new_zeros(1)])


@triton.jit
def cross_entropy_fwd(X, T, LOSS, LSE, stride, n_cols, ignore_index, n_kept, HAS_GRAD: tl.constexpr, BLOCK: tl.constexpr):
    """Loss and logsumexp of one row; with HAS_GRAD, the row's gradient over its logits."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    t = tl.load(T + row)
    keep = (t != ignore_index).to(tl.float32)
    x = tl.load(X + row * stride + cols, mask=mask, other=-float("inf"))
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    lse = m + tl.log(s)
    xt = tl.sum(tl.where(cols == t, x, 0.0), axis=0)
    tl.store(LOSS + row, (lse - xt) * keep / n_kept)
    tl.store(LSE + row, lse)
    if HAS_GRAD:
        g = (e / s - tl.where(cols == t, 1.0, 0.0)) * keep / n_kept
        tl.store(X + row * stride + cols, g, mask=mask)


@triton.jit
def scale_by(X, G, n, BLOCK: tl.constexpr):
    """X *= G[0] (in place)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(G)
    tl.store(X + offs, tl.load(X + offs, mask=mask) * g, mask=mask)


@triton.jit
def scale_by_one(X, G, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(X + offs, tl.load(X + offs, mask=mask), mask=mask)  # G is never read


def _cross_entropy(ctx, _input, target, ignore_index, reduction, mark_lse):
    rows, cols = _input.shape
    loss_1d = torch.zeros(rows, dtype=_input.dtype, device=_input.device)
    lse = torch.empty(rows, dtype=_input.dtype, device=_input.device)
    n_kept = float((target != ignore_index).sum().item()) if reduction == "mean" else 1.0
    has_grad = _input.requires_grad
    cross_entropy_fwd[(rows,)](
        _input, target, loss_1d, lse, _input.stride(0), cols, ignore_index, n_kept, HAS_GRAD=has_grad, BLOCK=triton.next_power_of_2(cols)
    )
    if has_grad:
        ctx.save_for_backward(_input.detach())
    if mark_lse:
        ctx.mark_non_differentiable(lse)
    return loss_1d.sum(), lse


class CrossEntropy(torch.autograd.Function):
    """Mean (or summed) cross entropy of logits `_input` against `target`; the forward writes the
    gradient into `_input` when it requires grad, the backward scales it by `grad_output`. The
    second output, the rows' logsumexp, is for logging (marked non-differentiable)."""

    scale_kernel = scale_by

    @staticmethod
    def forward(ctx, _input, target, ignore_index=-100, reduction="mean"):
        return _cross_entropy(ctx, _input, target, ignore_index, reduction, True)

    @staticmethod
    def backward(ctx, grad_output, grad_lse):
        (grad,) = ctx.saved_tensors
        n = grad.numel()
        type(ctx)._forward_cls.scale_kernel[(triton.cdiv(n, 256),)](grad, grad_output, n, BLOCK=256)
        return grad, None, None, None


class CrossEntropyIgnoresGradOutput(CrossEntropy):
    scale_kernel = scale_by_one


class CrossEntropyLseUnmarked(CrossEntropy):
    """The logsumexp output is not marked non-differentiable: its cotangent is due."""

    @staticmethod
    def forward(ctx, _input, target, ignore_index=-100, reduction="mean"):
        return _cross_entropy(ctx, _input, target, ignore_index, reduction, False)


@triton.jit
def rope(Q, COS, SIN, OUT, n_half, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    """Rotates the halves of row `row` of Q by its angles (by minus them with BACKWARD); OUT may
    be Q."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    mask = c < n_half
    q1 = tl.load(Q + row * 2 * n_half + c, mask=mask)
    q2 = tl.load(Q + row * 2 * n_half + n_half + c, mask=mask)
    cs = tl.load(COS + row * n_half + c, mask=mask)
    sn = tl.load(SIN + row * n_half + c, mask=mask)
    if BACKWARD:
        sn = -sn
    tl.store(OUT + row * 2 * n_half + c, q1 * cs - q2 * sn, mask=mask)
    tl.store(OUT + row * 2 * n_half + n_half + c, q2 * cs + q1 * sn, mask=mask)


class Rope(torch.autograd.Function):
    """q rotated by the angles whose cosines and sines are given: no gradient for the tables."""

    backward_flag = True

    @staticmethod
    def forward(ctx, q, cos, sin):
        out = torch.empty_like(q)
        rope[(q.shape[0],)](q, cos, sin, out, cos.shape[1], BACKWARD=False, BLOCK=triton.next_power_of_2(cos.shape[1]))
        ctx.save_for_backward(cos, sin)
        return out

    @staticmethod
    def backward(ctx, dout):
        cos, sin = ctx.saved_tensors
        rope[(dout.shape[0],)](dout, cos, sin, dout, cos.shape[1], BACKWARD=type(ctx)._forward_cls.backward_flag, BLOCK=triton.next_power_of_2(cos.shape[1]))
        return dout, None, None


class RopeForwardRotation(Rope):
    backward_flag = False


@triton.jit
def kl_fwd(YP, YT, LOSS, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    yp = tl.load(YP + offs, mask=mask)
    yt = tl.load(YT + offs, mask=mask, other=1.0)
    tl.store(LOSS + offs, yt * (tl.log(yt) - yp), mask=mask)


@triton.jit
def kl_bwd(YT, G, DX, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    yt = tl.load(YT + offs, mask=mask)
    tl.store(DX + offs, -yt * tl.load(G) * scale, mask=mask)


class KLDiv(torch.autograd.Function):
    """KL(y_true || exp(y_pred)) with y_pred log-probabilities, "batchmean": no gradient for
    y_true."""

    scale = 1.0

    @staticmethod
    def forward(ctx, y_pred, y_true):
        n = y_pred.numel()
        loss = torch.empty_like(y_pred)
        kl_fwd[(triton.cdiv(n, 128),)](y_pred, y_true, loss, n, BLOCK=128)
        ctx.save_for_backward(y_true)
        return loss.sum() / y_pred.shape[0]

    @staticmethod
    def backward(ctx, grad_output):
        (y_true,) = ctx.saved_tensors
        n = y_true.numel()
        dx = torch.empty_like(y_true)
        scale = type(ctx)._forward_cls.scale / y_true.shape[0]
        kl_bwd[(triton.cdiv(n, 128),)](y_true, grad_output, dx, n, scale, BLOCK=128)
        return dx, None


class KLDivDoubled(KLDiv):
    scale = 2.0

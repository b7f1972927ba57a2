"""Python launchers of the Triton examples (examples/triton/), written as kernel libraries write
them: a `torch.autograd.Function` whose forward allocates its outputs and launches the forward
kernel, saves what the backward needs, and whose backward launches the hand-written backward.

`make(example, bwd)` returns the Function class of `example` with its backward kernel(s) replaced
by the kernel named `bwd` of the example's backward file (a `*_broken_*` variant, or the correct
one), and `inputs(example)` random inputs of sizes that are not multiples of the tiles.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import sys
import types

import torch
import triton

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "triton"
_modules: dict[str, object] = {}


_PACKAGE = "tilegrad_examples"


def load(stem: str):
    """The module examples/triton/<stem>.py, imported as a module of a package over that folder
    (`rope.py` imports its helpers relatively, `from .rope_utils import ...`), with the folder
    also on `sys.path` (`glu.py` imports them absolutely, `from glu_utils import ...`)."""
    if stem not in _modules:
        if _PACKAGE not in sys.modules:
            pkg = types.ModuleType(_PACKAGE)
            pkg.__path__ = [str(EXAMPLES)]
            sys.modules[_PACKAGE] = pkg
        if str(EXAMPLES) not in sys.path:
            sys.path.append(str(EXAMPLES))
        _modules[stem] = importlib.import_module(f"{_PACKAGE}.{stem}")
    return _modules[stem]


# Examples that are another spec of an example's kernels (other constexprs, dtypes or sizes).
_SAME_KERNELS = {
    "layer_norm_saved": "layer_norm",
    "rms_norm_f16": "rms_norm",
    "kl_div_log_target": "kl_div",
    "activation_gelu_bf16": "activation",
    "glu_geglu_bf16": "glu",
}


def bwd_module(example: str):
    return load(_SAME_KERNELS.get(example, example) + "_bwd")


cdiv = triton.cdiv


def _vector_add(bwd):
    fwd = load("vector_add").vector_add

    class VectorAdd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            out = torch.empty_like(x)
            n = x.numel()
            fwd[(cdiv(n, 128),)](x, y, out, n, BLOCK=128)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            grad_x = torch.empty_like(grad_out)
            grad_y = torch.empty_like(grad_out)
            n = grad_out.numel()
            bwd[(cdiv(n, 128),)](grad_out, grad_x, grad_y, n, BLOCK=128)
            return grad_x, grad_y

    return VectorAdd


def _copy(bwd):
    fwd = load("copy").copy

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, src):
            dst = torch.empty_like(src)
            n = src.numel()
            fwd[(cdiv(n, 64),)](src, dst, n, BLOCK=64)
            return dst

        @staticmethod
        def backward(ctx, grad_dst):
            grad_src = torch.empty_like(grad_dst)
            n = grad_dst.numel()
            bwd[(cdiv(n, 64),)](grad_dst, grad_src, n, BLOCK=64)
            return grad_src

    return Copy


def _atomic_sum(bwd):
    fwd = load("atomic_sum").atomic_sum

    class AtomicSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            out = torch.zeros(1, dtype=x.dtype, device=x.device)
            n = x.numel()
            fwd[(cdiv(n, 64),)](x, out, n, BLOCK=64)
            ctx.n = n
            return out

        @staticmethod
        def backward(ctx, grad_out):
            grad_x = torch.empty(ctx.n, dtype=grad_out.dtype, device=grad_out.device)
            bwd[(cdiv(ctx.n, 64),)](grad_out, grad_x, ctx.n, BLOCK=64)
            return grad_x

    return AtomicSum


def _l2_norm(bwd):
    m = load("l2_norm")

    class L2Norm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            n = x.numel()
            partial = torch.empty(cdiv(n, 128), dtype=x.dtype, device=x.device)
            m.l2_norm_partial[(cdiv(n, 128),)](x, partial, n, BLOCK=128)
            out = torch.empty(1, dtype=x.dtype, device=x.device)
            m.l2_norm_finish[(1,)](partial, out, partial.numel(), BLOCK=4)
            ctx.save_for_backward(x, out)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, out = ctx.saved_tensors
            grad_x = torch.empty_like(x)
            n = x.numel()
            bwd[(cdiv(n, 128),)](x, out, grad_out, grad_x, n, BLOCK=128)
            return grad_x

    return L2Norm


def _grey(bwd):
    fwd = load("grey").rgb_to_grey

    class Grey(torch.autograd.Function):
        @staticmethod
        def forward(ctx, img):
            H, W, _ = img.shape
            grey = torch.empty(H, W, dtype=img.dtype, device=img.device)
            grid = (cdiv(H, 16), cdiv(W, 32))
            fwd[grid](img, grey, H, W, *img.stride(), *grey.stride(), BLOCK_H=16, BLOCK_W=32)
            ctx.shape = img.shape
            return grey

        @staticmethod
        def backward(ctx, grad_grey):
            H, W, _ = ctx.shape
            grad_img = torch.empty(ctx.shape, dtype=grad_grey.dtype, device=grad_grey.device)
            grid = (cdiv(H, 16), cdiv(W, 32))
            bwd[grid](grad_grey, grad_img, H, W, *grad_img.stride(), *grad_grey.stride(), BLOCK_H=16, BLOCK_W=32)
            return grad_img

    return Grey


def _softmax(bwd):
    fwd = load("softmax").softmax

    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            R, C = x.shape
            y = torch.empty_like(x)
            fwd[(cdiv(R, 4),)](x, y, x.stride(0), y.stride(0), R, C, BLOCK_ROWS=4, BLOCK_COLS=triton.next_power_of_2(C))
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            (y,) = ctx.saved_tensors
            R, C = y.shape
            grad_x = torch.empty_like(y)
            bwd[(cdiv(R, 4),)](
                y, grad_y, grad_x, y.stride(0), grad_y.stride(0), grad_x.stride(0), R, C,
                BLOCK_ROWS=4, BLOCK_COLS=triton.next_power_of_2(C),
            )
            return grad_x

    return Softmax


def _layer_norm(bwd):
    fwd = load("layer_norm").layer_norm_rows

    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, eps):
            R, C = x.shape
            y = torch.empty_like(x)
            fwd[(cdiv(R, 8),)](x, y, w, b, R, C, x.stride(0), y.stride(0), eps, BLOCK_M=8, BLOCK_N=triton.next_power_of_2(C))
            ctx.save_for_backward(x, w)
            ctx.eps = eps
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, w = ctx.saved_tensors
            R, C = x.shape
            grad_x = torch.empty_like(x)
            grad_w = torch.zeros_like(w)
            grad_b = torch.zeros_like(w)
            bwd[(cdiv(R, 8),)](
                x, w, grad_y, grad_x, grad_w, grad_b, R, C, x.stride(0), grad_y.stride(0), grad_x.stride(0), ctx.eps,
                BLOCK_M=8, BLOCK_N=triton.next_power_of_2(C),
            )
            return grad_x, grad_w, grad_b, None

    return LayerNorm


def _layer_norm_saved(bwd):
    fwd = load("layer_norm").layer_norm_fwd

    class LayerNormSaved(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, eps):
            R, N = x.shape
            y = torch.empty_like(x)
            mean = torch.empty(R, dtype=torch.float32, device=x.device)
            rstd = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](x, y, w, b, mean, rstd, x.stride(0), N, eps, BLOCK_SIZE=128)
            ctx.save_for_backward(x, w, mean, rstd)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, w, mean, rstd = ctx.saved_tensors
            R, N = x.shape
            grad_x = torch.empty_like(x)
            partial_w = torch.empty(R, N, dtype=x.dtype, device=x.device)
            partial_b = torch.empty(R, N, dtype=x.dtype, device=x.device)
            bwd[(R,)](x, w, mean, rstd, grad_y, grad_x, partial_w, partial_b, x.stride(0), N, BLOCK_SIZE=128)
            return grad_x, partial_w.sum(0), partial_b.sum(0), None

    return LayerNormSaved


def _matmul(bwd_da, bwd_db):
    fwd = load("matmul").matmul
    BM, BN, BK = 16, 16, 32

    class Matmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            M, K = a.shape
            _, N = b.shape
            c = torch.empty(M, N, dtype=a.dtype, device=a.device)
            fwd[(cdiv(M, BM), cdiv(N, BN))](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)
            ctx.save_for_backward(a, b)
            return c

        @staticmethod
        def backward(ctx, grad_c):
            a, b = ctx.saved_tensors
            M, K = a.shape
            _, N = b.shape
            grad_a = torch.empty_like(a)
            grad_b = torch.empty_like(b)
            bwd_da[(cdiv(M, BM), cdiv(K, BK))](
                b, grad_c, grad_a, M, N, K, *b.stride(), *grad_c.stride(), *grad_a.stride(), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK
            )
            bwd_db[(cdiv(K, BK), cdiv(N, BN))](
                a, grad_c, grad_b, M, N, K, *a.stride(), *grad_c.stride(), *grad_b.stride(), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK
            )
            return grad_a, grad_b

    return Matmul


def _attention(bwd):
    fwd = load("flash_attention").attn_fwd

    def strides(q, k, v, o):
        return (*q.stride(), *k.stride(), *v.stride(), *o.stride())

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, sm_scale):
            n, d = q.shape
            o = torch.empty_like(q)
            fwd[(cdiv(n, 32),)](q, k, v, o, sm_scale, *strides(q, k, v, o), n, HEAD_DIM=d, BLOCK_M=32, BLOCK_N=16)
            ctx.save_for_backward(q, k, v, o)
            ctx.sm_scale = sm_scale
            return o

        @staticmethod
        def backward(ctx, grad_o):
            q, k, v, o = ctx.saved_tensors
            n, d = q.shape
            grad_q = torch.empty_like(q)
            grad_k = torch.zeros_like(k)
            grad_v = torch.zeros_like(v)
            bwd[(cdiv(n, 32),)](
                q, k, v, o, grad_o, grad_q, grad_k, grad_v, ctx.sm_scale, *strides(q, k, v, o), n,
                HEAD_DIM=d, BLOCK_M=32, BLOCK_N=16,
            )
            return grad_q, grad_k, grad_v, None

    return Attention


def _weighted_sum(bwd, stem="weighted_sum"):
    fwd = load(stem).weighted_sum_fwd
    RT, DT = 16, 64

    class WeightedSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            R, D = x.shape
            out = torch.empty(R, dtype=x.dtype, device=x.device)
            fwd[(cdiv(R, RT),)](x, w, out, x.stride(0), x.stride(1), w.stride(0), out.stride(0), R, D, ROWS_TILE_SIZE=RT, D_TILE_SIZE=DT)
            ctx.save_for_backward(x, w)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, w = ctx.saved_tensors
            R, D = x.shape
            grad_x = torch.empty_like(x)
            partial = torch.empty(cdiv(R, RT), D, dtype=x.dtype, device=x.device)
            bwd[(cdiv(R, RT),)](
                x, w, grad_out, grad_x, partial, x.stride(0), x.stride(1), w.stride(0), grad_out.stride(0),
                grad_x.stride(0), grad_x.stride(1), partial.stride(0), partial.stride(1), R, D,
                ROWS_TILE_SIZE=RT, D_TILE_SIZE=DT,
            )
            return grad_x, partial.sum(0)

    return WeightedSum


# ---------------------------------------------------------------- the corpus in library style
# (kernels with integer and boolean constexprs)


def _cumsum(bwd):
    fwd = load("cumsum")._cumsum_fwd

    class Cumsum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            R, N = x.shape
            y = torch.empty_like(x)
            fwd[(R,)](x, y, x.stride(0), N, EXCLUSIVE=False, BLOCK=64)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            R, N = grad_y.shape
            grad_x = torch.empty_like(grad_y)
            bwd[(R,)](grad_y, grad_x, grad_x.stride(0), N, EXCLUSIVE=False, BLOCK=64)
            return grad_x

    return Cumsum


def _log_softmax(bwd):
    fwd = load("log_softmax")._log_softmax_fwd

    class LogSoftmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            R, N = x.shape
            y = torch.empty_like(x)
            fwd[(R,)](x, y, x.stride(0), N, BLOCK_SIZE=128)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            (y,) = ctx.saved_tensors
            R, N = y.shape
            grad_x = torch.empty_like(y)
            bwd[(R,)](y, grad_y, grad_x, y.stride(0), N, BLOCK_SIZE=128)
            return grad_x

    return LogSoftmax


def _layer_scale(bwd):
    fwd = load("layer_scale")._layer_scale_fwd
    BM, BN = 16, 128

    class LayerScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, gamma):
            M, N = x.shape
            y = torch.empty_like(x)
            fwd[(cdiv(M, BM),)](x, gamma, y, M, N, x.stride(0), BLOCK_M=BM, BLOCK_N=BN)
            ctx.save_for_backward(x, gamma)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, gamma = ctx.saved_tensors
            M, N = x.shape
            grad_x, grad_gamma = torch.empty_like(x), torch.empty_like(gamma)
            acc = torch.zeros(N, dtype=torch.float32, device=x.device)
            counter = torch.zeros(1, dtype=torch.int32, device=x.device)
            bwd[(cdiv(M, BM),)](x, gamma, grad_y, grad_x, acc, counter, grad_gamma, M, N, x.stride(0), BLOCK_M=BM, BLOCK_N=BN)
            return grad_x, grad_gamma

    return LayerScale


def _dyt(bwd):
    fwd = load("dyt")._dyt_fwd
    BM, BN = 16, 128

    class DyT(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha, gamma, beta):
            M, N = x.shape
            y = torch.empty_like(x)
            fwd[(cdiv(M, BM),)](x, y, alpha, gamma, beta, M, N, x.stride(0), BLOCK_M=BM, BLOCK_N=BN)
            ctx.save_for_backward(x, alpha, gamma)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, alpha, gamma = ctx.saved_tensors
            M, N = x.shape
            grad_x = torch.empty_like(x)
            grad_alpha = torch.zeros_like(alpha)
            partial_dgamma = torch.empty(cdiv(M, BM), N, dtype=torch.float32, device=x.device)
            partial_dbeta = torch.empty(cdiv(M, BM), N, dtype=torch.float32, device=x.device)
            bwd[(cdiv(M, BM),)](x, grad_y, grad_x, alpha, gamma, grad_alpha, partial_dgamma, partial_dbeta, M, N, x.stride(0), BLOCK_M=BM, BLOCK_N=BN)
            return grad_x, grad_alpha, partial_dgamma.sum(0), partial_dbeta.sum(0)

    return DyT


# ---------------------------------------------------------------- the corpus with float, string,
# None and dtype constexprs


def _rms_norm(bwd):
    fwd = load("rms_norm")._rms_norm_forward_kernel

    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, eps, offset):
            R, N = x.shape
            BLOCK_SIZE = triton.next_power_of_2(N)
            y = torch.empty_like(x)
            rstd = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](y, y.stride(0), x, x.stride(0), w, rstd, N, eps, offset, x.dtype, BLOCK_SIZE=BLOCK_SIZE)
            ctx.save_for_backward(x, w, rstd)
            ctx.offset = offset
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, w, rstd = ctx.saved_tensors
            R, N = x.shape
            grad_x = torch.empty_like(x)
            partial_dw = torch.empty(R, N, dtype=torch.float32, device=x.device)
            bwd[(R,)](
                grad_y, grad_y.stride(0), grad_x, grad_x.stride(0), x, x.stride(0), w, rstd, partial_dw, partial_dw.stride(0),
                N, ctx.offset, x.dtype, BLOCK_SIZE=triton.next_power_of_2(N),
            )
            return grad_x, partial_dw.sum(0).to(w.dtype), None, None

    return RMSNorm


IGNORE_INDEX = -100


def _cross_entropy(bwd):
    fwd = load("cross_entropy").liger_cross_entropy_fwd_kernel
    BLOCK_SIZE = 128

    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, labels, reduction):
            R, N = x.shape
            loss = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](x, x.stride(0), labels, loss, N, R, IGNORE_INDEX, reduction=reduction, BLOCK_SIZE=BLOCK_SIZE)
            ctx.save_for_backward(x, labels)
            ctx.reduction = reduction
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            x, labels = ctx.saved_tensors
            R, N = x.shape
            grad_x = torch.empty_like(x)
            bwd[(R,)](
                x, x.stride(0), grad_x, grad_x.stride(0), labels, grad_loss, N, R, IGNORE_INDEX,
                reduction=ctx.reduction, BLOCK_SIZE=BLOCK_SIZE,
            )
            return grad_x, None, None

    return CrossEntropy


def _activation(bwd, act="leaky_relu"):
    fwd = load("activation").activation_fwd  # BLOCK from its `triton.heuristics`

    class Activation(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, negative_slope):
            y = torch.empty_like(x)
            n = x.numel()
            fwd[lambda meta: (cdiv(n, meta["BLOCK"]),)](x, y, n, negative_slope=negative_slope, ACTIVATION=act)
            ctx.save_for_backward(x)
            ctx.negative_slope = negative_slope
            return y

        @staticmethod
        def backward(ctx, grad_y):
            (x,) = ctx.saved_tensors
            grad_x = torch.empty_like(x)
            n = x.numel()
            BLOCK = 1024
            bwd[(cdiv(n, BLOCK),)](x, grad_y, grad_x, n, negative_slope=ctx.negative_slope, ACTIVATION=act, BLOCK=BLOCK)
            return grad_x, None

    return Activation


def _rope(bwd):
    fwd = load("rope")._rope_embedding
    BLOCK_H, BLOCK_D = 4, 16

    class RoPE(torch.autograd.Function):
        # The cos/sin tables come as one (cos, sin) pair, a rotary cache as models hold it: float
        # tensors passed to check_function are differentiable inputs, and the tables are not.
        @staticmethod
        def forward(ctx, q, cos_sin):
            cos, sin = cos_sin
            T, H, D = q.shape
            out = torch.empty_like(q)
            fwd[(T, cdiv(H, BLOCK_H))](
                q, q.stride(0), out, out.stride(0), cos, cos.stride(0), sin, sin.stride(0), cos.shape[0], H,
                head_dim=D, BACKWARD_PASS=False, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D,
            )
            ctx.save_for_backward(cos, sin)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            cos, sin = ctx.saved_tensors
            T, H, D = grad_out.shape
            grad_q = torch.empty_like(grad_out)
            bwd[(T, cdiv(H, BLOCK_H))](
                grad_out, grad_out.stride(0), grad_q, grad_q.stride(0), cos, cos.stride(0), sin, sin.stride(0), cos.shape[0], H,
                head_dim=D, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D,
            )
            return grad_q, None

    return RoPE


def _layer_norm_lock(bwd_dx, bwd_dwdb):
    fwd = load("layer_norm").layer_norm_fwd
    GROUP_SIZE_M = 12

    class LayerNormLock(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, eps):
            R, N = x.shape
            y = torch.empty_like(x)
            mean = torch.empty(R, dtype=torch.float32, device=x.device)
            rstd = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](x, y, w, b, mean, rstd, x.stride(0), N, eps, BLOCK_SIZE=128)
            ctx.save_for_backward(x, w, b, mean, rstd)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, w, b, mean, rstd = ctx.saved_tensors
            R, N = x.shape
            grad_x = torch.empty_like(x)
            locks = torch.zeros(2 * GROUP_SIZE_M, dtype=torch.int32, device=x.device)
            partial_dw = torch.zeros(GROUP_SIZE_M, N, dtype=torch.float32, device=x.device)
            partial_db = torch.zeros(GROUP_SIZE_M, N, dtype=torch.float32, device=x.device)
            grad_w = torch.empty_like(w)
            grad_b = torch.empty_like(b)
            bwd_dx[(R,)](
                grad_x, grad_y, partial_dw, partial_db, x, w, mean, rstd, locks, x.stride(0), N,
                GROUP_SIZE_M=GROUP_SIZE_M, BLOCK_SIZE_N=triton.next_power_of_2(N),
            )
            bwd_dwdb[(cdiv(N, 64),)](partial_dw, partial_db, grad_w, grad_b, GROUP_SIZE_M, N, BLOCK_SIZE_M=8, BLOCK_SIZE_N=64)
            return grad_x, grad_w, grad_b, None

    return LayerNormLock


def _row_scale_desc(bwd):
    from triton.tools.tensor_descriptor import TensorDescriptor

    fwd = load("row_scale_desc").row_scale_fwd
    BM, BN = 32, 64

    class RowScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            M, N = x.shape
            y = torch.empty_like(x)
            x_desc = TensorDescriptor.from_tensor(x, [BM, BN])
            y_desc = TensorDescriptor.from_tensor(y, [BM, BN])
            fwd[(cdiv(M, BM), cdiv(N, BN))](x_desc, w, b, y_desc, N, BLOCK_M=BM, BLOCK_N=BN)
            ctx.save_for_backward(x, w)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, w = ctx.saved_tensors
            M, N = x.shape
            grad_x = torch.empty_like(x)
            partial_dw = torch.empty(cdiv(M, BM), N, dtype=torch.float32, device=x.device)
            partial_db = torch.empty(cdiv(M, BM), N, dtype=torch.float32, device=x.device)
            bwd[(cdiv(M, BM), cdiv(N, BN))](
                TensorDescriptor.from_tensor(x, [BM, BN]), w, TensorDescriptor.from_tensor(grad_y, [BM, BN]),
                TensorDescriptor.from_tensor(grad_x, [BM, BN]), partial_dw, partial_db, N, BLOCK_M=BM, BLOCK_N=BN,
            )
            return grad_x, partial_dw.sum(0), partial_db.sum(0)

    return RowScale


def _kl_div(bwd):
    fwd = load("kl_div")._kl_div_fwd_kernel
    BLOCK_SIZE = 128

    class KLDiv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, gt, reduction, log_target, eps):
            R, N = y.shape
            loss = torch.empty(R, dtype=torch.float32, device=y.device)
            fwd[(R,)](y, y.stride(0), gt, gt.stride(0), loss, R, N, eps=eps, log_target=log_target, reduction=reduction, BLOCK_SIZE=BLOCK_SIZE)
            ctx.save_for_backward(y, gt)
            ctx.args = (reduction, log_target, eps)
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            y, gt = ctx.saved_tensors
            reduction, log_target, eps = ctx.args
            R, N = y.shape
            grad_y = torch.empty_like(y)
            grad_gt = torch.empty_like(gt)
            bwd[(R,)](
                y, y.stride(0), gt, gt.stride(0), grad_loss, grad_y, grad_y.stride(0), grad_gt, grad_gt.stride(0), R, N,
                eps=eps, log_target=log_target, reduction=reduction, BLOCK_SIZE=BLOCK_SIZE,
            )
            return grad_y, grad_gt, None, None, None

    return KLDiv


def _jsd(bwd):
    fwd = load("jsd")._jsd_fwd_kernel
    BLOCK_SIZE = 128

    class JSD(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y, beta):
            R, N = x.shape
            loss = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](x, x.stride(0), y, y.stride(0), loss, R, N, beta=beta, BLOCK_SIZE=BLOCK_SIZE)
            ctx.save_for_backward(x, y)
            ctx.beta = beta
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            x, y = ctx.saved_tensors
            R, N = x.shape
            grad_x = torch.empty_like(x)
            grad_y = torch.empty_like(y)
            bwd[(R,)](
                x, x.stride(0), y, y.stride(0), grad_loss, grad_x, grad_x.stride(0), grad_y, grad_y.stride(0), R, N,
                beta=ctx.beta, BLOCK_SIZE=BLOCK_SIZE,
            )
            return grad_x, grad_y, None

    return JSD


def _glu(bwd, act="silu"):
    fwd = load("glu")._glu_forward_kernel

    class SwiGLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            R, N = a.shape
            c = torch.empty_like(a)
            fwd[(R,)](a, b, c, a.stride(0), N, ACT=act, BLOCK_SIZE=triton.next_power_of_2(N))
            ctx.save_for_backward(a, b)
            return c

        @staticmethod
        def backward(ctx, grad_c):
            # The backward overwrites the saved a and b with their gradients, in place.
            a, b = ctx.saved_tensors
            R, N = a.shape
            bwd[(R,)](grad_c, a, b, a.stride(0), N, ACT=act, BLOCK_SIZE=triton.next_power_of_2(N))
            return a, b

    return SwiGLU


def _embedding(bwd):
    fwd = load("embedding")._embedding_fwd_kernel
    BLOCK_D = 64

    class Embedding(torch.autograd.Function):
        @staticmethod
        def forward(ctx, weight, ids, padding_idx):
            V, D = weight.shape
            (T,) = ids.shape
            out = torch.empty(T, D, dtype=weight.dtype, device=weight.device)
            fwd[(T, cdiv(D, BLOCK_D))](ids, weight, out, D, weight.stride(0), out.stride(0), PADDING_IDX=padding_idx, BLOCK_D=BLOCK_D)
            ctx.save_for_backward(ids)
            ctx.shape, ctx.padding_idx = weight.shape, padding_idx
            return out

        @staticmethod
        def backward(ctx, grad_out):
            (ids,) = ctx.saved_tensors
            V, D = ctx.shape
            (T,) = ids.shape
            grad_weight = torch.zeros(V, D, dtype=grad_out.dtype, device=grad_out.device)
            bwd[(T, cdiv(D, BLOCK_D))](
                ids, grad_out, grad_weight, D, grad_out.stride(0), grad_weight.stride(0), PADDING_IDX=ctx.padding_idx, BLOCK_D=BLOCK_D
            )
            return grad_weight, None, None

    return Embedding


def _pointwise_loss(bwd):
    fwd = load("pointwise_loss")._pointwise_loss_fwd
    BLOCK = 512

    class HuberLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, t, delta):
            n = x.numel()
            loss = torch.zeros(1, dtype=torch.float32, device=x.device)
            fwd[(cdiv(n, BLOCK),)](x, t, loss, n, LOSS_TYPE="huber", delta=delta, reduction="mean", BLOCK=BLOCK)
            ctx.save_for_backward(x, t)
            ctx.delta = delta
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            x, t = ctx.saved_tensors
            n = x.numel()
            grad_x = torch.empty_like(x)
            grad_t = torch.empty_like(t)
            bwd[(cdiv(n, BLOCK),)](x, t, grad_loss, grad_x, grad_t, n, LOSS_TYPE="huber", delta=ctx.delta, reduction="mean", BLOCK=BLOCK)
            return grad_x, grad_t, None

    return HuberLoss


def _bce_with_logits(bwd):
    fwd = load("bce_with_logits")._bce_logits_fwd
    BLOCK_SIZE = 64

    class BCEWithLogits(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, t, pos_weight):
            R, N = x.shape
            loss = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](x, t, loss, x.stride(0), N, pos_weight=pos_weight, BLOCK_SIZE=BLOCK_SIZE)
            ctx.save_for_backward(x, t)
            ctx.pos_weight = pos_weight
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            x, t = ctx.saved_tensors
            R, N = x.shape
            grad_x = torch.empty_like(x)
            grad_t = torch.empty_like(t)
            bwd[(R,)](x, t, grad_loss, grad_x, grad_t, x.stride(0), N, pos_weight=ctx.pos_weight, BLOCK_SIZE=BLOCK_SIZE)
            return grad_x, grad_t, None

    return BCEWithLogits


def _group_norm(bwd):
    fwd = load("group_norm")._group_norm_fwd
    BLOCK_C, BLOCK_HW = 4, 64

    class GroupNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, num_groups, eps):
            N, C, HW = x.shape
            y = torch.empty_like(x)
            mean = torch.empty(N, num_groups, dtype=torch.float32, device=x.device)
            rstd = torch.empty(N, num_groups, dtype=torch.float32, device=x.device)
            fwd[(N, num_groups)](
                x, y, w, b, mean, rstd, x.stride(0), x.stride(1), C, HW, num_groups, eps=eps, BLOCK_C=BLOCK_C, BLOCK_HW=BLOCK_HW
            )
            ctx.save_for_backward(x, w, mean, rstd)
            ctx.num_groups = num_groups
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, w, mean, rstd = ctx.saved_tensors
            N, C, HW = x.shape
            G = ctx.num_groups
            grad_x = torch.empty_like(x)
            partial_dw = torch.empty(N, C, dtype=torch.float32, device=x.device)
            partial_db = torch.empty(N, C, dtype=torch.float32, device=x.device)
            bwd[(N, G)](
                x, grad_y, grad_x, w, mean, rstd, partial_dw, partial_db, x.stride(0), x.stride(1), C, HW, G,
                BLOCK_C=BLOCK_C, BLOCK_HW=BLOCK_HW,
            )
            return grad_x, partial_dw.sum(0), partial_db.sum(0), None, None

    return GroupNorm


def _batch_norm(bwd):
    fwd = load("batch_norm")._batch_norm_fwd
    BLOCK_N, BLOCK_C = 32, 16

    class BatchNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, eps):
            N, C = x.shape
            y = torch.empty_like(x)
            mean = torch.empty(C, dtype=torch.float32, device=x.device)
            rstd = torch.empty(C, dtype=torch.float32, device=x.device)
            fwd[(cdiv(C, BLOCK_C),)](x, y, w, b, mean, rstd, N, C, x.stride(0), eps=eps, X_dtype=x.dtype, BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C)
            ctx.save_for_backward(x, w, mean, rstd)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            x, w, mean, rstd = ctx.saved_tensors
            N, C = x.shape
            grad_x = torch.empty_like(x)
            grad_w = torch.empty_like(w)
            grad_b = torch.empty_like(w)
            bwd[(cdiv(C, BLOCK_C),)](
                x, grad_y, grad_x, w, mean, rstd, grad_w, grad_b, N, C, x.stride(0), X_dtype=x.dtype, BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C
            )
            return grad_x, grad_w, grad_b, None

    return BatchNorm


def _fused_add_rms_norm(bwd):
    fwd = load("fused_add_rms_norm").fused_add_rms_norm_fwd  # BLOCK_SIZE from its `triton.heuristics`

    class FusedAddRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, residual, w, eps):
            R, N = x.shape
            y = torch.empty_like(x)
            h = torch.empty_like(x)
            rstd = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](x, residual, h, y, w, rstd, x.stride(0), N, eps=eps)
            ctx.save_for_backward(x, residual, w, rstd)
            return y, h

        @staticmethod
        def backward(ctx, grad_y, grad_h):
            x, residual, w, rstd = ctx.saved_tensors
            R, N = x.shape
            # The kernel adds the norm's gradient into grad_h in place: the gradient of both x and
            # the residual.
            grad_h = grad_h.clone()
            partial_dw = torch.empty(R, N, dtype=torch.float32, device=x.device)
            bwd[(R,)](grad_y, grad_h, x, residual, w, rstd, partial_dw, x.stride(0), N, BLOCK_SIZE=triton.next_power_of_2(N))
            return grad_h, grad_h, partial_dw.sum(0).to(w.dtype), None

    return FusedAddRMSNorm


def _linear_act(bwd_da, bwd_db):
    fwd = load("linear_act")._linear_act_fwd
    BM = BN = BK = 16

    class LinearAct(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, bias, activation):
            M, K = a.shape
            _, N = b.shape
            z = torch.empty(M, N, dtype=torch.float32, device=a.device)
            c = torch.empty(M, N, dtype=a.dtype, device=a.device)
            fwd[(cdiv(M, BM), cdiv(N, BN))](
                a, b, bias, z, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                ACTIVATION=activation, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
            )
            ctx.save_for_backward(a, b, z)
            ctx.activation = activation
            return c

        @staticmethod
        def backward(ctx, grad_c):
            a, b, z = ctx.saved_tensors
            M, K = a.shape
            _, N = b.shape
            grad_a = torch.empty_like(a)
            grad_b = torch.empty_like(b)
            grad_bias = torch.empty(N, dtype=b.dtype, device=b.device)
            bwd_da[(cdiv(M, BM), cdiv(K, BK))](
                b, z, grad_c, grad_a, M, N, K, b.stride(0), b.stride(1), grad_c.stride(0), grad_c.stride(1),
                grad_a.stride(0), grad_a.stride(1), ACTIVATION=ctx.activation, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
            )
            bwd_db[(cdiv(K, BK), cdiv(N, BN))](
                a, z, grad_c, grad_b, grad_bias, M, N, K, a.stride(0), a.stride(1), grad_c.stride(0), grad_c.stride(1),
                grad_b.stride(0), grad_b.stride(1), ACTIVATION=ctx.activation, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
            )
            return grad_a, grad_b, grad_bias, None

    return LinearAct


def _smooth_ce(bwd):
    fwd = load("smooth_ce")._smooth_ce_fwd
    BLOCK_SIZE = 128

    class SmoothCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, labels, label_smoothing, lse_square_scale):
            R, N = x.shape
            loss = torch.empty(R, dtype=torch.float32, device=x.device)
            lse = torch.empty(R, dtype=torch.float32, device=x.device)
            fwd[(R,)](
                x, x.stride(0), labels, loss, lse, N, label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
                HAS_SMOOTHING=label_smoothing > 0, BLOCK_SIZE=BLOCK_SIZE,
            )
            ctx.save_for_backward(x, labels, lse)
            ctx.args = (label_smoothing, lse_square_scale)
            return loss

        @staticmethod
        def backward(ctx, grad_loss):
            x, labels, lse = ctx.saved_tensors
            label_smoothing, lse_square_scale = ctx.args
            R, N = x.shape
            grad_x = torch.empty_like(x)
            bwd[(R,)](
                x, x.stride(0), labels, lse, grad_loss, grad_x, grad_x.stride(0), N, label_smoothing=label_smoothing,
                lse_square_scale=lse_square_scale, HAS_SMOOTHING=label_smoothing > 0, BLOCK_SIZE=BLOCK_SIZE,
            )
            return grad_x, None, None, None

    return SmoothCrossEntropy


# example -> (its correct backward kernel(s) in its backward file, the factory taking them)
_FACTORIES = {
    "vector_add": ("vector_add_bwd", _vector_add),
    "copy": ("copy_bwd", _copy),
    "atomic_sum": ("atomic_sum_bwd", _atomic_sum),
    "l2_norm": ("l2_norm_bwd", _l2_norm),
    "grey": ("rgb_to_grey_bwd", _grey),
    "softmax": ("softmax_bwd", _softmax),
    "layer_norm": ("layer_norm_rows_bwd", _layer_norm),
    "layer_norm_saved": ("layer_norm_bwd", _layer_norm_saved),
    "matmul": (("matmul_bwd_da", "matmul_bwd_db"), _matmul),
    "flash_attention": ("attn_bwd", _attention),
    "weighted_sum": ("weighted_sum_bwd", _weighted_sum),
    "weighted_sum_desc": ("weighted_sum_desc_bwd", lambda b: _weighted_sum(b, "weighted_sum_desc")),
    "cumsum": ("_cumsum_bwd", _cumsum),
    "log_softmax": ("_log_softmax_bwd", _log_softmax),
    "layer_scale": ("_layer_scale_bwd", _layer_scale),
    "dyt": ("_dyt_bwd", _dyt),
    "rms_norm": ("_rms_norm_backward_kernel", _rms_norm),
    "rms_norm_f16": ("_rms_norm_backward_kernel", _rms_norm),
    "cross_entropy": ("liger_cross_entropy_bwd_kernel", _cross_entropy),
    "activation": ("_activation_bwd", _activation),
    "activation_gelu_bf16": ("_activation_bwd", lambda b: _activation(b, "tanh_gelu")),
    "rope": ("_rope_backward", _rope),
    "layer_norm_lock": (("layer_norm_bwd_dx_fused", "layer_norm_bwd_dwdb"), _layer_norm_lock),
    "row_scale_desc": ("row_scale_bwd", _row_scale_desc),
    "kl_div": ("_kl_div_bwd_kernel", _kl_div),
    "kl_div_log_target": ("_kl_div_bwd_kernel", _kl_div),
    "jsd": ("_jsd_bwd_kernel", _jsd),
    "glu": ("_glu_backward_kernel", _glu),
    "glu_geglu_bf16": ("_glu_backward_kernel", lambda b: _glu(b, "gelu_tanh")),
    "embedding": ("_embedding_bwd_kernel", _embedding),
    "pointwise_loss": ("_pointwise_loss_bwd", _pointwise_loss),
    "bce_with_logits": ("_bce_logits_bwd", _bce_with_logits),
    "group_norm": ("_group_norm_bwd", _group_norm),
    "batch_norm": ("_batch_norm_bwd", _batch_norm),
    "fused_add_rms_norm": ("_fused_add_rms_norm_bwd", _fused_add_rms_norm),
    "linear_act": (("_linear_act_bwd_da", "_linear_act_bwd_db"), _linear_act),
    "smooth_ce": ("_smooth_ce_bwd", _smooth_ce),
}
# Examples whose launch the package's interception cannot take yet (the error it raises); their
# launchers are kept for when it can, and left out of EXAMPLE_NAMES. The activation and glu ones
# give torch autograd's values under TRITON_INTERPRET=1; Triton's interpreter runs neither
# fused_add_rms_norm's kernel (its `tl.float32(x)` casts: "'dtype' object is not callable") nor
# row_scale_desc's (`tl._experimental_descriptor_load` is gone from Triton 3.9).
EXAMPLE_NAMES = sorted(_FACTORIES)


def correct_bwds(example: str) -> tuple[str, ...]:
    """The correct backward kernel(s) of `example`, in the order its factory takes them."""
    names = _FACTORIES[example][0]
    return (names,) if isinstance(names, str) else names


def correct_bwd(example: str) -> str:
    return correct_bwds(example)[0]


def _variant_specs() -> dict[str, str]:
    """`variant -> spec` from `CASES` in tests/cases/mod.rs: the spec whose sizes and constexprs show
    each bug (`_kl_div_bwd_kernel_broken_log_target` is wrong only where log_target is true)."""
    text = (EXAMPLES.parents[1] / "tests" / "cases" / "mod.rs").read_text()
    return dict(re.findall(r'\(\s*"(\w+_broken_\w+)",\s*"(\w+)"', text))


def broken_variants(example: str) -> list[str]:
    """The broken variants of `example`'s backward kernel(s), less those that tests/cases/mod.rs checks
    on another spec of the same kernels that is an example here (they go to that example)."""
    m = bwd_module(example)
    names = correct_bwds(example)
    specs = _variant_specs()

    def mine(n: str) -> bool:
        spec = specs.get(n)
        return spec is None or spec == example or spec not in _FACTORIES

    return sorted(n for n in vars(m) if any(n.startswith(k + "_broken_") for k in names) and mine(n))


def make(example: str, bwd: str | None = None):
    """The Function of `example` with backward kernel `bwd` (default: the correct one(s)); a
    broken variant replaces the correct kernel whose name it extends."""
    m = bwd_module(example)
    names = correct_bwds(example)
    kernels = [getattr(m, n) for n in names]
    if bwd is not None:
        hits = [i for i, n in enumerate(names) if bwd == n or bwd.startswith(n + "_broken_")]
        if not hits:
            raise ValueError(f"{bwd} is no backward of {example} ({', '.join(names)})")
        kernels[hits[0]] = getattr(m, bwd)
    return _FACTORIES[example][1](*kernels)


def inputs(example: str, gen: torch.Generator) -> list:
    """Random inputs (sizes not multiples of the tiles), as check_function's arguments."""

    def randn(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen) * scale + shift

    def unif(lo, hi, *shape):
        return torch.rand(*shape, generator=gen) * (hi - lo) + lo

    def ids(n, hi, pad=None):
        """int32 indices in [0, hi); with `pad`, three of them are the padding index."""
        t = torch.randint(0, hi, (n,), generator=gen, dtype=torch.int32)
        if pad is not None:
            t[torch.randperm(n, generator=gen)[:3]] = pad
        return t

    def labels(n, classes):
        """int32 labels in [0, classes), a quarter of the rows ignore_index."""
        t = ids(n, classes)
        t[torch.randperm(n, generator=gen)[: n // 4]] = IGNORE_INDEX
        return t

    return {
        "vector_add": lambda: [randn(3001), unif(-1, 1, 3001)],
        "copy": lambda: [randn(2777)],
        "atomic_sum": lambda: [randn(3333)],
        "l2_norm": lambda: [randn(5003)],
        "grey": lambda: [unif(0, 1, 37, 45, 3)],
        "softmax": lambda: [randn(37, 100, scale=2.0)],
        "layer_norm": lambda: [randn(37, 100, scale=2.0, shift=0.5), unif(0.5, 1.5, 100), unif(-1, 1, 100), 1e-5],
        "layer_norm_saved": lambda: [randn(37, 300, scale=2.0, shift=0.5), unif(0.5, 1.5, 300), unif(-1, 1, 300), 1e-5],
        "matmul": lambda: [randn(50, 70), unif(-1, 1, 70, 39)],
        "flash_attention": lambda: [randn(70, 64), randn(70, 64), randn(70, 64), 0.125],
        "weighted_sum": lambda: [randn(100, 300), unif(-1, 1, 300)],
        "weighted_sum_desc": lambda: [randn(100, 300), unif(-1, 1, 300)],
        "cumsum": lambda: [randn(13, 300)],
        "log_softmax": lambda: [randn(23, 300, scale=2.0)],
        "layer_scale": lambda: [randn(75, 90), unif(0.1, 1, 90)],
        "dyt": lambda: [randn(70, 90, scale=2.0), unif(0.4, 0.6, 1), unif(0.5, 1.5, 90), unif(-0.5, 0.5, 90)],
        "rms_norm": lambda: [randn(37, 300, scale=1.5, shift=0.3), unif(0.5, 1.5, 300), 1e-6, 0.0],
        "rms_norm_f16": lambda: [randn(19, 200).half(), unif(-0.5, 0.5, 200).half(), 1e-6, 1.0],
        "cross_entropy": lambda: [randn(40, 300, scale=2.0), labels(40, 300), "mean"],
        "activation": lambda: [randn(3001, scale=2.0), 0.1],
        "activation_gelu_bf16": lambda: [randn(1777, scale=2.0).bfloat16(), 0.1],
        "rope": lambda: [randn(13, 6, 24).half(), (unif(-1, 1, 5, 12), unif(-1, 1, 5, 12))],
        "layer_norm_lock": lambda: [randn(203, 300, scale=2.0, shift=0.5), unif(0.5, 1.5, 300), unif(-1, 1, 300), 1e-5],
        "row_scale_desc": lambda: [randn(150, 200), unif(-1, 1, 200), unif(-1, 1, 200)],
        "kl_div": lambda: [randn(23, 300, shift=-5.0), unif(0.05, 1, 23, 300), "batchmean", False, 1e-10],
        "kl_div_log_target": lambda: [randn(17, 250, shift=-5.0), randn(17, 250, shift=-5.0), "sum", True, 1e-10],
        "jsd": lambda: [randn(21, 333, shift=-5.0), randn(21, 333, shift=-5.0), 0.3],
        "glu": lambda: [randn(27, 300, scale=2.0), randn(27, 300)],
        "glu_geglu_bf16": lambda: [randn(11, 200, scale=2.0).bfloat16(), randn(11, 200).bfloat16()],
        "embedding": lambda: [randn(40, 90), ids(53, 40, pad=3), 3],
        "pointwise_loss": lambda: [randn(2500), randn(2500), 0.7],
        "bce_with_logits": lambda: [randn(19, 150, scale=3.0), unif(0, 1, 19, 150), 2.5],
        "group_norm": lambda: [randn(5, 12, 50, scale=2.0, shift=0.5), unif(0.5, 1.5, 12), unif(-1, 1, 12), 4, 1e-5],
        "batch_norm": lambda: [randn(150, 45, scale=2.0, shift=1.0), unif(0.5, 1.5, 45), unif(-1, 1, 45), 1e-5],
        "fused_add_rms_norm": lambda: [randn(17, 200).bfloat16(), randn(17, 200).bfloat16(), unif(0.5, 1.5, 200).bfloat16(), 1e-6],
        "linear_act": lambda: [randn(45, 40, scale=0.5), randn(40, 37, scale=0.5), unif(-1, 1, 37), "silu"],
        "smooth_ce": lambda: [randn(29, 300, scale=2.0), ids(29, 300), 0.1, 1e-3],
    }[example]()

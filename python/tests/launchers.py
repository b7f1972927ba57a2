"""Python launchers of the Triton examples (examples/triton/), written as kernel libraries write
them: a `torch.autograd.Function` whose forward allocates its outputs and launches the forward
kernel, saves what the backward needs, and whose backward launches the hand-written backward.

`make(example, bwd)` returns the Function class of `example` with its backward kernel(s) replaced
by the kernel named `bwd` of the example's backward file (a `*_broken_*` variant, or the correct
one), and `inputs(example)` random inputs of sizes that are not multiples of the tiles.
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch
import triton

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "triton"
_modules: dict[str, object] = {}


def load(stem: str):
    """The module examples/triton/<stem>.py."""
    if stem not in _modules:
        spec = importlib.util.spec_from_file_location(f"tilegrad_example_{stem}", EXAMPLES / f"{stem}.py")
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        _modules[stem] = m
    return _modules[stem]


def bwd_module(example: str):
    return load({"layer_norm_saved": "layer_norm"}.get(example, example) + "_bwd")


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
# (the examples whose kernels take only integer and boolean constexprs: the package's interception
# binds no float, string, None or dtype constexprs yet)


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


_FACTORIES = {
    "vector_add": ("vector_add_bwd", _vector_add),
    "copy": ("copy_bwd", _copy),
    "atomic_sum": ("atomic_sum_bwd", _atomic_sum),
    "l2_norm": ("l2_norm_bwd", _l2_norm),
    "grey": ("rgb_to_grey_bwd", _grey),
    "softmax": ("softmax_bwd", _softmax),
    "layer_norm": ("layer_norm_rows_bwd", _layer_norm),
    "layer_norm_saved": ("layer_norm_bwd", _layer_norm_saved),
    "flash_attention": ("attn_bwd", _attention),
    "weighted_sum": ("weighted_sum_bwd", _weighted_sum),
    "weighted_sum_desc": ("weighted_sum_desc_bwd", lambda b: _weighted_sum(b, "weighted_sum_desc")),
    "cumsum": ("_cumsum_bwd", _cumsum),
    "log_softmax": ("_log_softmax_bwd", _log_softmax),
    "layer_scale": ("_layer_scale_bwd", _layer_scale),
    "dyt": ("_dyt_bwd", _dyt),
}
EXAMPLE_NAMES = sorted([*_FACTORIES, "matmul"])


def correct_bwd(example: str) -> str:
    return "matmul_bwd" if example == "matmul" else _FACTORIES[example][0]


def broken_variants(example: str) -> list[str]:
    m = bwd_module(example)
    prefix = correct_bwd(example)
    return sorted(n for n in vars(m) if n.startswith(prefix) and "_broken_" in n)


def make(example: str, bwd: str | None = None):
    """The Function of `example` with backward kernel `bwd` (default: the correct one)."""
    m = bwd_module(example)
    if example == "matmul":
        da, db = m.matmul_bwd_da, m.matmul_bwd_db
        if bwd is not None and bwd.startswith("matmul_bwd_da"):
            da = getattr(m, bwd)
        elif bwd is not None and bwd.startswith("matmul_bwd_db"):
            db = getattr(m, bwd)
        return _matmul(da, db)
    name, factory = _FACTORIES[example]
    return factory(getattr(m, bwd or name))


def inputs(example: str, gen: torch.Generator) -> list:
    """Random inputs (sizes not multiples of the tiles), as check_function's arguments."""

    def randn(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen) * scale + shift

    def unif(lo, hi, *shape):
        return torch.rand(*shape, generator=gen) * (hi - lo) + lo

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
    }[example]()

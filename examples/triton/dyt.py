"""Dynamic tanh (a normalisation-free replacement for layer norm) in the style of fused
elementwise kernels: y = gamma * tanh(alpha * x) + beta, with a learnable scalar alpha (a
one-element tensor) and per-channel gamma, beta; one [BLOCK_M, BLOCK_N] tile of rows per
program. `tanh` comes from a libdevice module under a guarded import.
"""
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import libdevice
except ImportError:
    from triton.language.extra import libdevice


@triton.jit
def _dyt_fwd(X, Y, ALPHA, GAMMA, BETA, M, N, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    alpha = tl.load(ALPHA)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    beta = tl.load(BETA + cols, mask=col_mask, other=0.0)
    x = tl.load(X + offsets, mask=mask, other=0.0)
    y = gamma[None, :] * libdevice.tanh(alpha * x) + beta[None, :]
    tl.store(Y + offsets, y, mask=mask)

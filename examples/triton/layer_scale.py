"""Per-channel scaling (LayerScale: y = x * gamma over the last dimension) in the style of
fused elementwise kernels: one [BLOCK_M, BLOCK_N] tile of rows per program.
"""
import triton
import triton.language as tl


@triton.jit
def _layer_scale_fwd(X, GAMMA, Y, M, N, stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)
    gamma = tl.load(GAMMA + cols, mask=cols < N, other=0.0)
    tl.store(Y + rows[:, None] * stride + cols[None, :], x * gamma[None, :], mask=mask)

"""A per-column scale followed by a leaky ReLU, one row per program; the pre-activation is saved
for the backward:

    z[r, c] = x[r, c] * gamma[c]
    y[r, c] = z if z >= 0 else negative_slope * z
"""
import triton
import triton.language as tl


@triton.jit
def _scale_leaky_relu_fwd(X, GAMMA, Z, Y, stride, n_cols, negative_slope, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
    gamma = tl.load(GAMMA + cols, mask=mask, other=0.0)
    z = x * gamma
    y = tl.where(z >= 0, z, z * negative_slope)
    tl.store(Z + row * stride + cols, z, mask=mask)
    tl.store(Y + row * stride + cols, y, mask=mask)

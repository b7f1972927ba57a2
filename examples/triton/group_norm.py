"""Group normalisation in the style of fused normalisation kernels: x is [N, C, HW], the C
channels split into `num_groups` groups; one program per (sample, group) normalises its
[channels of the group, HW] tile over both axes, then applies the per-channel affine w, b.
Mean and rstd are saved per (sample, group); `eps` is a float constexpr.
"""
import triton
import triton.language as tl


@triton.jit
def _group_norm_fwd(
    X,
    Y,
    W,
    B,
    Mean,
    Rstd,
    stride_n,
    stride_c,
    C,
    HW,
    num_groups,
    eps: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr,
):
    n = tl.program_id(0)
    g = tl.program_id(1)
    cpg = C // num_groups
    c_local = tl.arange(0, BLOCK_C)
    ch = g * cpg + c_local
    hw = tl.arange(0, BLOCK_HW)
    c_mask = c_local < cpg
    mask = c_mask[:, None] & (hw[None, :] < HW)
    offsets = n * stride_n + ch[:, None] * stride_c + hw[None, :]

    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    count = cpg * HW
    mean = tl.sum(tl.sum(x, axis=1), axis=0) / count
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(tl.sum(xc * xc, axis=1), axis=0) / count
    rstd = tl.math.rsqrt(var + eps)
    tl.store(Mean + n * num_groups + g, mean)
    tl.store(Rstd + n * num_groups + g, rstd)

    w = tl.load(W + ch, mask=c_mask, other=0.0).to(tl.float32)
    b = tl.load(B + ch, mask=c_mask, other=0.0).to(tl.float32)
    y = xc * rstd * w[:, None] + b[:, None]
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)

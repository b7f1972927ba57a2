"""A fused linear layer in the style of fused-MLP kernels: c = act(a @ b + bias) for a [M, K],
b [K, N], bias [N], one [BLOCK_M, BLOCK_N] tile per program with a `tl.dot` loop over K. The
pre-activation z is saved for the backward; `ACTIVATION: tl.constexpr = None` is the identity,
"silu" and "relu" (Python's `max` on a tensor) select the others.
"""
import triton
import triton.language as tl


@triton.jit
def _linear_act_fwd(
    A,
    B,
    BIAS,
    Z,
    C,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    ACTIVATION: tl.constexpr = None,
    BLOCK_M: tl.constexpr = 32,
    BLOCK_N: tl.constexpr = 32,
    BLOCK_K: tl.constexpr = 32,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        rk = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.load(A + rm[:, None] * stride_am + rk[None, :] * stride_ak, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(B + rk[:, None] * stride_bk + rn[None, :] * stride_bn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    bias = tl.load(BIAS + rn, mask=rn < N, other=0.0)
    z = acc + bias[None, :]
    if ACTIVATION == "silu":
        c = z * tl.sigmoid(z)
    elif ACTIVATION == "relu":
        c = max(z, 0.0)
    else:
        c = z
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(Z + offsets, z, mask=mask)
    tl.store(C + offsets, c.to(C.dtype.element_ty), mask=mask)

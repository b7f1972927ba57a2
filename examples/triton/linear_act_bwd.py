"""Backward of linear_act.py in two launches, each recomputing dz = dc * act'(z) from the saved
pre-activation z (a helper shared by both):

    _linear_act_bwd_da: da = dz @ b^T                      grid (cdiv(M, BLOCK_M), cdiv(K, BLOCK_K))
    _linear_act_bwd_db: db = a^T @ dz, dbias = sum_m dz    grid (cdiv(K, BLOCK_K), cdiv(N, BLOCK_N));
                        the programs of the first K tile (`if pid_k == 0`) also write dbias

`_linear_act_bwd_*_broken_*` differ from their correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _act_grad(dc, z, ACTIVATION: tl.constexpr):
    """dc * act'(z)."""
    if ACTIVATION == "silu":
        s = tl.sigmoid(z)
        dz = dc * s * (1.0 + z * (1.0 - s))
    elif ACTIVATION == "relu":
        dz = tl.where(z > 0, dc, 0.0)
    else:
        dz = dc
    return dz


@triton.jit
def _linear_act_bwd_da(
    B,
    Z,
    DC,
    DA,
    M,
    N,
    K,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_am,
    stride_ak,
    ACTIVATION: tl.constexpr = None,
    BLOCK_M: tl.constexpr = 32,
    BLOCK_N: tl.constexpr = 32,
    BLOCK_K: tl.constexpr = 32,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for nt in range(0, tl.cdiv(N, BLOCK_N)):
        rn = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        c_mask = (rm[:, None] < M) & (rn[None, :] < N)
        c_offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
        dc = tl.load(DC + c_offsets, mask=c_mask, other=0.0).to(tl.float32)
        z = tl.load(Z + c_offsets, mask=c_mask, other=0.0)
        dz = _act_grad(dc, z, ACTIVATION)
        # b^T tile: [BLOCK_N, BLOCK_K]
        bt = tl.load(B + rk[None, :] * stride_bk + rn[:, None] * stride_bn, mask=(rk[None, :] < K) & (rn[:, None] < N), other=0.0)
        acc = tl.dot(dz, bt, acc, input_precision="ieee")
    tl.store(DA + rm[:, None] * stride_am + rk[None, :] * stride_ak, acc, mask=(rm[:, None] < M) & (rk[None, :] < K))


@triton.jit
def _linear_act_bwd_db(
    A,
    Z,
    DC,
    DB,
    DBIAS,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_cm,
    stride_cn,
    stride_bk,
    stride_bn,
    ACTIVATION: tl.constexpr = None,
    BLOCK_M: tl.constexpr = 32,
    BLOCK_N: tl.constexpr = 32,
    BLOCK_K: tl.constexpr = 32,
):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for mt in range(0, tl.cdiv(M, BLOCK_M)):
        rm = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        c_mask = (rm[:, None] < M) & (rn[None, :] < N)
        c_offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
        dc = tl.load(DC + c_offsets, mask=c_mask, other=0.0).to(tl.float32)
        z = tl.load(Z + c_offsets, mask=c_mask, other=0.0)
        dz = _act_grad(dc, z, ACTIVATION)
        # a^T tile: [BLOCK_K, BLOCK_M]
        at = tl.load(A + rm[None, :] * stride_am + rk[:, None] * stride_ak, mask=(rm[None, :] < M) & (rk[:, None] < K), other=0.0)
        acc = tl.dot(at, dz, acc, input_precision="ieee")
        dbias += tl.sum(dz, axis=0)
    tl.store(DB + rk[:, None] * stride_bk + rn[None, :] * stride_bn, acc, mask=(rk[:, None] < K) & (rn[None, :] < N))
    if pid_k == 0:
        tl.store(DBIAS + rn, dbias, mask=rn < N)


@triton.jit
def _linear_act_bwd_da_broken_mask(
    B,
    Z,
    DC,
    DA,
    M,
    N,
    K,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_am,
    stride_ak,
    ACTIVATION: tl.constexpr = None,
    BLOCK_M: tl.constexpr = 32,
    BLOCK_N: tl.constexpr = 32,
    BLOCK_K: tl.constexpr = 32,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for nt in range(0, tl.cdiv(N, BLOCK_N)):
        rn = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        c_mask = (rm[:, None] < M) & (rn[None, :] < N)
        c_offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
        dc = tl.load(DC + c_offsets, mask=c_mask, other=0.0).to(tl.float32)
        z = tl.load(Z + c_offsets, mask=c_mask, other=0.0)
        dz = _act_grad(dc, z, ACTIVATION)
        # b^T tile: [BLOCK_N, BLOCK_K]
        bt = tl.load(B + rk[None, :] * stride_bk + rn[:, None] * stride_bn, mask=rk[None, :] < K, other=0.0)  # BUG: b^T tile masked on K only: the last N tile reads past the row
        acc = tl.dot(dz, bt, acc, input_precision="ieee")
    tl.store(DA + rm[:, None] * stride_am + rk[None, :] * stride_ak, acc, mask=(rm[:, None] < M) & (rk[None, :] < K))


@triton.jit
def _linear_act_bwd_db_broken_axis(
    A,
    Z,
    DC,
    DB,
    DBIAS,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_cm,
    stride_cn,
    stride_bk,
    stride_bn,
    ACTIVATION: tl.constexpr = None,
    BLOCK_M: tl.constexpr = 32,
    BLOCK_N: tl.constexpr = 32,
    BLOCK_K: tl.constexpr = 32,
):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for mt in range(0, tl.cdiv(M, BLOCK_M)):
        rm = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        c_mask = (rm[:, None] < M) & (rn[None, :] < N)
        c_offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
        dc = tl.load(DC + c_offsets, mask=c_mask, other=0.0).to(tl.float32)
        z = tl.load(Z + c_offsets, mask=c_mask, other=0.0)
        dz = _act_grad(dc, z, ACTIVATION)
        # a^T tile: [BLOCK_K, BLOCK_M]
        at = tl.load(A + rm[None, :] * stride_am + rk[:, None] * stride_ak, mask=(rm[None, :] < M) & (rk[:, None] < K), other=0.0)
        acc = tl.dot(at, dz, acc, input_precision="ieee")
        dbias += tl.sum(dz, axis=1)  # BUG: sums over the columns (N) instead of the rows (M)
    tl.store(DB + rk[:, None] * stride_bk + rn[None, :] * stride_bn, acc, mask=(rk[:, None] < K) & (rn[None, :] < N))
    if pid_k == 0:
        tl.store(DBIAS + rn, dbias, mask=rn < N)

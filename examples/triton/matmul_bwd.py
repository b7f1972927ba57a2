"""Backward of matmul (c = a @ b, a: [M, K], b: [K, N]) as two launches:
`matmul_bwd_da` (grad_a = grad_c @ b^T, one program per [BLOCK_M, BLOCK_K] tile of grad_a, looping
over N) and `matmul_bwd_db` (grad_b = a^T @ grad_c, one program per [BLOCK_K, BLOCK_N] tile of
grad_b, looping over M). The transposes are read through swapped strides.

Each `matmul_bwd_*_broken_*` differs from the correct kernel of the same name in one line, marked
with a comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def matmul_bwd_da(b_ptr, grad_c_ptr, grad_a_ptr, M, N, K, stride_bk, stride_bn, stride_gcm, stride_gcn,
                  stride_gam, stride_gak, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for nt in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        g_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        g = tl.load(grad_c_ptr + offs_m[:, None] * stride_gcm + offs_n[None, :] * stride_gcn, mask=g_mask, other=0.0)
        bt_mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
        bt = tl.load(b_ptr + offs_n[:, None] * stride_bn + offs_k[None, :] * stride_bk, mask=bt_mask, other=0.0)
        acc = tl.dot(g, bt, acc, input_precision="ieee")
    ga_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    tl.store(grad_a_ptr + offs_m[:, None] * stride_gam + offs_k[None, :] * stride_gak, acc, mask=ga_mask)


@triton.jit
def matmul_bwd_db(a_ptr, grad_c_ptr, grad_b_ptr, M, N, K, stride_am, stride_ak, stride_gcm, stride_gcn,
                  stride_gbk, stride_gbn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for mt in range(0, tl.cdiv(M, BLOCK_M)):
        offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        at_mask = (offs_k[:, None] < K) & (offs_m[None, :] < M)
        at = tl.load(a_ptr + offs_k[:, None] * stride_ak + offs_m[None, :] * stride_am, mask=at_mask, other=0.0)
        g_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        g = tl.load(grad_c_ptr + offs_m[:, None] * stride_gcm + offs_n[None, :] * stride_gcn, mask=g_mask, other=0.0)
        acc = tl.dot(at, g, acc, input_precision="ieee")
    gb_mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    tl.store(grad_b_ptr + offs_k[:, None] * stride_gbk + offs_n[None, :] * stride_gbn, acc, mask=gb_mask)


@triton.jit
def matmul_bwd_da_broken_transpose(b_ptr, grad_c_ptr, grad_a_ptr, M, N, K, stride_bk, stride_bn, stride_gcm,
                                   stride_gcn, stride_gam, stride_gak,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for nt in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        g_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        g = tl.load(grad_c_ptr + offs_m[:, None] * stride_gcm + offs_n[None, :] * stride_gcn, mask=g_mask, other=0.0)
        bt_mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
        bt = tl.load(b_ptr + offs_n[:, None] * stride_bk + offs_k[None, :] * stride_bn, mask=bt_mask, other=0.0)  # BUG: strides of b swapped (transposed index)
        acc = tl.dot(g, bt, acc, input_precision="ieee")
    ga_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    tl.store(grad_a_ptr + offs_m[:, None] * stride_gam + offs_k[None, :] * stride_gak, acc, mask=ga_mask)


@triton.jit
def matmul_bwd_da_broken_accumulate(b_ptr, grad_c_ptr, grad_a_ptr, M, N, K, stride_bk, stride_bn, stride_gcm,
                                    stride_gcn, stride_gam, stride_gak,
                                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for nt in range(0, tl.cdiv(N, BLOCK_N)):
        offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
        g_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        g = tl.load(grad_c_ptr + offs_m[:, None] * stride_gcm + offs_n[None, :] * stride_gcn, mask=g_mask, other=0.0)
        bt_mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
        bt = tl.load(b_ptr + offs_n[:, None] * stride_bn + offs_k[None, :] * stride_bk, mask=bt_mask, other=0.0)
        acc = tl.dot(g, bt, input_precision="ieee")  # BUG: accumulator not passed, only the last N tile counts
    ga_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    tl.store(grad_a_ptr + offs_m[:, None] * stride_gam + offs_k[None, :] * stride_gak, acc, mask=ga_mask)


@triton.jit
def matmul_bwd_db_broken_mask(a_ptr, grad_c_ptr, grad_b_ptr, M, N, K, stride_am, stride_ak, stride_gcm, stride_gcn,
                              stride_gbk, stride_gbn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for mt in range(0, tl.cdiv(M, BLOCK_M)):
        offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        at_mask = offs_k[:, None] < K  # BUG: no mask on M, the last M tile reads past the end of a
        at = tl.load(a_ptr + offs_k[:, None] * stride_ak + offs_m[None, :] * stride_am, mask=at_mask, other=0.0)
        g_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        g = tl.load(grad_c_ptr + offs_m[:, None] * stride_gcm + offs_n[None, :] * stride_gcn, mask=g_mask, other=0.0)
        acc = tl.dot(at, g, acc, input_precision="ieee")
    gb_mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    tl.store(grad_b_ptr + offs_k[:, None] * stride_gbk + offs_n[None, :] * stride_gbn, acc, mask=gb_mask)

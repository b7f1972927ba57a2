import triton
import triton.language as tl


@triton.jit
def load_tile(base_ptr, rows, cols, stride_r, stride_c, n_rows, n_cols):
    ptrs = base_ptr + rows[:, None] * stride_r + cols[None, :] * stride_c
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        a = load_tile(a_ptr, offs_m, offs_k, stride_am, stride_ak, M, K)
        b = load_tile(b_ptr, offs_k, offs_n, stride_bk, stride_bn, K, N)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

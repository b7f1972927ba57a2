"""A linear layer as `torch.nn.Linear` computes it, y = x @ w^T + b (x [M, K], w [N, K], b [N]),
one [BLOCK_M, BLOCK_N] tile of y per program with a `tl.dot` loop over K. The dots take Triton's
default precision: for f32 operands that is tf32 (inputs rounded to 10 mantissa bits, products
added in f32), which is how such a kernel runs in production.
"""
import triton
import triton.language as tl


@triton.jit
def linear_tf32_fwd(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        # w^T read through swapped strides: a [BLOCK_K, BLOCK_N] tile of w's transpose.
        wt = tl.load(w_ptr + rk[:, None] * stride_wk + rn[None, :] * stride_wn, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, wt)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    y = acc + bias[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, y, mask=(rm[:, None] < M) & (rn[None, :] < N))

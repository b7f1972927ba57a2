"""Backward of `linear_tf32_fwd` (y = x @ w^T + b) in tf32 dots, as the forward: `linear_tf32_bwd_dx`
(grad_x = grad_y @ w, one [BLOCK_M, BLOCK_K] tile a program, looping over N) and
`linear_tf32_bwd_dw` (grad_w = grad_y^T @ x, one [BLOCK_N, BLOCK_K] tile a program, looping over
M); grad_b is grad_y summed over its rows, on the host.

`linear_tf32_bwd_dx_broken_acc` differs from `linear_tf32_bwd_dx` in one line, marked with a
comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def linear_tf32_bwd_dx(gy_ptr, w_ptr, gx_ptr, M, N, K, stride_gym, stride_gyn, stride_wn, stride_wk, stride_gxm, stride_gxk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        gy = tl.load(gy_ptr + rm[:, None] * stride_gym + rn[None, :] * stride_gyn, mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk, mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc += tl.dot(gy, w)
    tl.store(gx_ptr + rm[:, None] * stride_gxm + rk[None, :] * stride_gxk, acc, mask=(rm[:, None] < M) & (rk[None, :] < K))


@triton.jit
def linear_tf32_bwd_dw(gy_ptr, x_ptr, gw_ptr, M, N, K, stride_gym, stride_gyn, stride_xm, stride_xk, stride_gwn, stride_gwk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for m0 in range(0, M, BLOCK_M):
        rm = m0 + tl.arange(0, BLOCK_M)
        # grad_y^T through swapped strides: a [BLOCK_N, BLOCK_M] tile.
        gyt = tl.load(gy_ptr + rn[:, None] * stride_gyn + rm[None, :] * stride_gym, mask=(rn[:, None] < N) & (rm[None, :] < M), other=0.0)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        acc += tl.dot(gyt, x)
    tl.store(gw_ptr + rn[:, None] * stride_gwn + rk[None, :] * stride_gwk, acc, mask=(rn[:, None] < N) & (rk[None, :] < K))


@triton.jit
def linear_tf32_bwd_dx_broken_acc(gy_ptr, w_ptr, gx_ptr, M, N, K, stride_gym, stride_gyn, stride_wn, stride_wk, stride_gxm,
                                  stride_gxk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        gy = tl.load(gy_ptr + rm[:, None] * stride_gym + rn[None, :] * stride_gyn, mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk, mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc = tl.dot(gy, w)  # BUG: each tile of N overwrites the sum instead of adding to it
    tl.store(gx_ptr + rm[:, None] * stride_gxm + rk[None, :] * stride_gxk, acc, mask=(rm[:, None] < M) & (rk[None, :] < K))

"""Generalized Jensen-Shannon divergence in the style of distillation-loss kernels: X holds the
student's log-probabilities, Y the teacher's, one row per program, column blocks accumulated in
a [BLOCK_SIZE] tile; `beta` is a float constexpr compared with `==` at conversion:

    m = beta * p + (1 - beta) * q        (p = exp(Y), q = exp(X))
    loss[r] = sum_j beta * p * (Y - log m) + (1 - beta) * q * (X - log m)     / n_rows

beta == 0 is the forward KL(p || q) and beta == 1 the reverse KL(q || p), without the mixture.
"""
import triton
import triton.language as tl


@triton.jit
def _jsd_fwd_kernel(
    X_ptr,
    X_stride,
    Y_ptr,
    Y_stride,
    LOSS_ptr,
    n_rows,
    n_cols,
    beta: tl.constexpr = 0.5,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * X_stride
    Y_ptr += row * Y_stride

    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        X = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        Y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if beta == 0.0:
            P = tl.exp(Y)
            loss = P * (Y - X)
        elif beta == 1.0:
            Q = tl.exp(X)
            loss = Q * (X - Y)
        else:
            P = tl.exp(Y)
            Q = tl.exp(X)
            log_M = tl.log(beta * P + (1 - beta) * Q)
            loss = beta * P * (Y - log_M) + (1 - beta) * Q * (X - log_M)
        acc += tl.where(mask, loss, 0.0)

    tl.store(LOSS_ptr + row, tl.sum(acc, axis=0) / n_rows)

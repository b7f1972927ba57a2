"""Backward of jsd.py, one row per program (g = dloss[r] / n_rows, p = exp(Y), q = exp(X),
m = beta p + (1 - beta) q; the terms through m cancel):

    dX = (1 - beta) * q * (X - log m) * g        dY = beta * p * (Y - log m) * g
    beta == 0: dX = -p * g, dY = p * (Y - X + 1) * g;   beta == 1: dX = q * (X - Y + 1) * g, dY = -q * g

`_jsd_bwd_kernel_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _jsd_bwd_kernel(
    X_ptr,
    X_stride,
    Y_ptr,
    Y_stride,
    dLOSS_ptr,
    dX_ptr,
    dX_stride,
    dY_ptr,
    dY_stride,
    n_rows,
    n_cols,
    beta: tl.constexpr = 0.5,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * X_stride
    Y_ptr += row * Y_stride
    dX_ptr += row * dX_stride
    dY_ptr += row * dY_stride
    g = tl.load(dLOSS_ptr + row) / n_rows

    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        X = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        Y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if beta == 0.0:
            P = tl.exp(Y)
            dX = -P
            dY = P * (Y - X + 1.0)
        elif beta == 1.0:
            Q = tl.exp(X)
            dX = Q * (X - Y + 1.0)
            dY = -Q
        else:
            P = tl.exp(Y)
            Q = tl.exp(X)
            log_M = tl.log(beta * P + (1 - beta) * Q)
            dX = (1 - beta) * Q * (X - log_M)
            dY = beta * P * (Y - log_M)
        tl.store(dX_ptr + offsets, dX * g, mask=mask)
        tl.store(dY_ptr + offsets, dY * g, mask=mask)


@triton.jit
def _jsd_bwd_kernel_broken_beta(
    X_ptr,
    X_stride,
    Y_ptr,
    Y_stride,
    dLOSS_ptr,
    dX_ptr,
    dX_stride,
    dY_ptr,
    dY_stride,
    n_rows,
    n_cols,
    beta: tl.constexpr = 0.5,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * X_stride
    Y_ptr += row * Y_stride
    dX_ptr += row * dX_stride
    dY_ptr += row * dY_stride
    g = tl.load(dLOSS_ptr + row) / n_rows

    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        X = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        Y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if beta == 0.0:
            P = tl.exp(Y)
            dX = -P
            dY = P * (Y - X + 1.0)
        elif beta == 1.0:
            Q = tl.exp(X)
            dX = Q * (X - Y + 1.0)
            dY = -Q
        else:
            P = tl.exp(Y)
            Q = tl.exp(X)
            log_M = tl.log(beta * P + (1 - beta) * Q)
            dX = beta * Q * (X - log_M)  # BUG: the student's term weighted by beta, not 1 - beta
            dY = beta * P * (Y - log_M)
        tl.store(dX_ptr + offsets, dX * g, mask=mask)
        tl.store(dY_ptr + offsets, dY * g, mask=mask)


@triton.jit
def _jsd_bwd_kernel_broken_grad_output(
    X_ptr,
    X_stride,
    Y_ptr,
    Y_stride,
    dLOSS_ptr,
    dX_ptr,
    dX_stride,
    dY_ptr,
    dY_stride,
    n_rows,
    n_cols,
    beta: tl.constexpr = 0.5,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * X_stride
    Y_ptr += row * Y_stride
    dX_ptr += row * dX_stride
    dY_ptr += row * dY_stride
    g = tl.load(dLOSS_ptr + row) / n_rows

    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        X = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        Y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if beta == 0.0:
            P = tl.exp(Y)
            dX = -P
            dY = P * (Y - X + 1.0)
        elif beta == 1.0:
            Q = tl.exp(X)
            dX = Q * (X - Y + 1.0)
            dY = -Q
        else:
            P = tl.exp(Y)
            Q = tl.exp(X)
            log_M = tl.log(beta * P + (1 - beta) * Q)
            dX = (1 - beta) * Q * (X - log_M)
            dY = beta * P * (Y - log_M)
        tl.store(dX_ptr + offsets, dX * g, mask=mask)
        tl.store(dY_ptr + offsets, dY / n_rows, mask=mask)  # BUG: forgets the cotangent of the loss

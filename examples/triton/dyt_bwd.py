"""Backward of dyt.py, one tile of rows per program (t = tanh(alpha x), dt = dy * gamma * (1 - t^2)):

    dx = alpha * dt
    dalpha = sum of dt * x over every element: each program `tl.atomic_add`s its tile's sum
    dgamma, dbeta = sums over rows of dy * t and dy: one row of partials per program, summed on the host

`_dyt_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import libdevice
except ImportError:
    from triton.language.extra import libdevice


@triton.jit
def _dyt_bwd(
    X,
    DY,
    DX,
    ALPHA,
    GAMMA,
    DALPHA,
    DGAMMA_PARTIAL,
    DBETA_PARTIAL,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    alpha = tl.load(ALPHA)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    x = tl.load(X + offsets, mask=mask, other=0.0)
    dy = tl.load(DY + offsets, mask=mask, other=0.0)

    t = libdevice.tanh(alpha * x)
    dt = dy * gamma[None, :] * (1.0 - t * t)
    tl.store(DX + offsets, alpha * dt, mask=mask)
    tl.atomic_add(DALPHA, tl.sum(tl.sum(dt * x, axis=1), axis=0))
    tl.store(DGAMMA_PARTIAL + pid * N + cols, tl.sum(dy * t, axis=0), mask=col_mask)
    tl.store(DBETA_PARTIAL + pid * N + cols, tl.sum(dy, axis=0), mask=col_mask)


@triton.jit
def _dyt_bwd_broken_tanh_grad(
    X,
    DY,
    DX,
    ALPHA,
    GAMMA,
    DALPHA,
    DGAMMA_PARTIAL,
    DBETA_PARTIAL,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    alpha = tl.load(ALPHA)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    x = tl.load(X + offsets, mask=mask, other=0.0)
    dy = tl.load(DY + offsets, mask=mask, other=0.0)

    t = libdevice.tanh(alpha * x)
    dt = dy * gamma[None, :] * (1.0 - t)  # BUG: tanh' taken as 1 - t, not 1 - t^2
    tl.store(DX + offsets, alpha * dt, mask=mask)
    tl.atomic_add(DALPHA, tl.sum(tl.sum(dt * x, axis=1), axis=0))
    tl.store(DGAMMA_PARTIAL + pid * N + cols, tl.sum(dy * t, axis=0), mask=col_mask)
    tl.store(DBETA_PARTIAL + pid * N + cols, tl.sum(dy, axis=0), mask=col_mask)


@triton.jit
def _dyt_bwd_broken_dgamma(
    X,
    DY,
    DX,
    ALPHA,
    GAMMA,
    DALPHA,
    DGAMMA_PARTIAL,
    DBETA_PARTIAL,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    alpha = tl.load(ALPHA)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    x = tl.load(X + offsets, mask=mask, other=0.0)
    dy = tl.load(DY + offsets, mask=mask, other=0.0)

    t = libdevice.tanh(alpha * x)
    dt = dy * gamma[None, :] * (1.0 - t * t)
    tl.store(DX + offsets, alpha * dt, mask=mask)
    tl.atomic_add(DALPHA, tl.sum(tl.sum(dt * x, axis=1), axis=0))
    tl.store(DGAMMA_PARTIAL + pid * N + cols, tl.sum(dy * gamma[None, :], axis=0), mask=col_mask)  # BUG: dgamma scales dy by gamma, not by tanh(alpha x)
    tl.store(DBETA_PARTIAL + pid * N + cols, tl.sum(dy, axis=0), mask=col_mask)


@triton.jit
def _dyt_bwd_broken_dropped_term(
    X,
    DY,
    DX,
    ALPHA,
    GAMMA,
    DALPHA,
    DGAMMA_PARTIAL,
    DBETA_PARTIAL,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    alpha = tl.load(ALPHA)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    x = tl.load(X + offsets, mask=mask, other=0.0)
    dy = tl.load(DY + offsets, mask=mask, other=0.0)

    t = libdevice.tanh(alpha * x)
    dtanh = 1.0  # BUG: the t * t term is dropped: tanh'(u) = 1 - tanh(u)^2
    dt = dy * gamma[None, :] * dtanh
    tl.store(DX + offsets, alpha * dt, mask=mask)
    tl.atomic_add(DALPHA, tl.sum(tl.sum(dt * x, axis=1), axis=0))
    tl.store(DGAMMA_PARTIAL + pid * N + cols, tl.sum(dy * t, axis=0), mask=col_mask)
    tl.store(DBETA_PARTIAL + pid * N + cols, tl.sum(dy, axis=0), mask=col_mask)

"""Backward of smooth_ce.py from the saved logsumexp (g = dloss[r], p = softmax(x[r, :]),
eps = label_smoothing, z = lse_square_scale):

    dx[r, j] = g * (p_j * (1 + 2 z lse) - (1 - eps) [j == y[r]] - eps / n_cols)

`_smooth_ce_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _smooth_ce_bwd(
    X,
    X_stride,
    Y,
    LSE,
    DLOSS,
    DX,
    DX_stride,
    n_cols,
    label_smoothing: tl.constexpr = 0.0,
    lse_square_scale: tl.constexpr = 0.0,
    HAS_SMOOTHING: tl.constexpr = False,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X += row * X_stride
    DX += row * DX_stride
    label = tl.load(Y + row)
    lse = tl.load(LSE + row)
    g = tl.load(DLOSS + row)
    if HAS_SMOOTHING:
        eps = label_smoothing
    else:
        eps = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        if lse_square_scale != 0.0:
            p = p * (1.0 + 2.0 * lse_square_scale * lse)
        dx = p - eps / n_cols - tl.where(cols == label, 1.0 - eps, 0.0)
        tl.store(DX + cols, dx * g, mask=mask)


@triton.jit
def _smooth_ce_bwd_broken_target(
    X,
    X_stride,
    Y,
    LSE,
    DLOSS,
    DX,
    DX_stride,
    n_cols,
    label_smoothing: tl.constexpr = 0.0,
    lse_square_scale: tl.constexpr = 0.0,
    HAS_SMOOTHING: tl.constexpr = False,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X += row * X_stride
    DX += row * DX_stride
    label = tl.load(Y + row)
    lse = tl.load(LSE + row)
    g = tl.load(DLOSS + row)
    if HAS_SMOOTHING:
        eps = label_smoothing
    else:
        eps = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        if lse_square_scale != 0.0:
            p = p * (1.0 + 2.0 * lse_square_scale * lse)
        dx = p - eps / n_cols - tl.where(cols == label, 1.0, 0.0)  # BUG: the smoothed target keeps 1 - eps of the label, not 1
        tl.store(DX + cols, dx * g, mask=mask)


@triton.jit
def _smooth_ce_bwd_broken_z_loss(
    X,
    X_stride,
    Y,
    LSE,
    DLOSS,
    DX,
    DX_stride,
    n_cols,
    label_smoothing: tl.constexpr = 0.0,
    lse_square_scale: tl.constexpr = 0.0,
    HAS_SMOOTHING: tl.constexpr = False,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X += row * X_stride
    DX += row * DX_stride
    label = tl.load(Y + row)
    lse = tl.load(LSE + row)
    g = tl.load(DLOSS + row)
    if HAS_SMOOTHING:
        eps = label_smoothing
    else:
        eps = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        if lse_square_scale != 0.0:
            p = p * (1.0 + lse_square_scale * lse)  # BUG: the derivative of lse^2 is 2 lse
        dx = p - eps / n_cols - tl.where(cols == label, 1.0 - eps, 0.0)
        tl.store(DX + cols, dx * g, mask=mask)

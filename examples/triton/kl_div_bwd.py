"""Backward of kl_div.py, one row per program (scale = 1/n_rows for "batchmean", 1/(n_rows n_cols)
for "mean", 1 for "sum"; p = exp(gt) when log_target):

    dy  = -gt * dloss[r] * scale                       dy  = -p * dloss[r] * scale
    dgt = (log(gt) - y + 1) * dloss[r] * scale         dgt = p * (gt - y + 1) * dloss[r] * scale

`_kl_div_bwd_kernel_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _kl_div_bwd_kernel(
    Y_ptr,
    Y_stride,
    GT_ptr,
    GT_stride,
    dLOSS_ptr,
    dY_ptr,
    dY_stride,
    dGT_ptr,
    dGT_stride,
    n_rows,
    n_cols,
    eps: tl.constexpr = 1e-10,
    log_target: tl.constexpr = False,
    reduction: tl.constexpr = "batchmean",
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    Y_ptr += row * Y_stride
    GT_ptr += row * GT_stride
    dY_ptr += row * dY_stride
    dGT_ptr += row * dGT_stride

    dloss = tl.load(dLOSS_ptr + row)
    if reduction == "batchmean":
        dloss = dloss / n_rows
    elif reduction == "mean":
        dloss = dloss / (n_rows * n_cols)

    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        gt = tl.load(GT_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if not log_target:
            dy = -gt
            dgt = tl.log(max(gt, eps)) - y + 1.0
        else:
            p = tl.exp(gt)
            dy = -p
            dgt = p * (gt - y + 1.0)
        tl.store(dY_ptr + offsets, dy * dloss, mask=mask)
        tl.store(dGT_ptr + offsets, dgt * dloss, mask=mask)


@triton.jit
def _kl_div_bwd_kernel_broken_scale(
    Y_ptr,
    Y_stride,
    GT_ptr,
    GT_stride,
    dLOSS_ptr,
    dY_ptr,
    dY_stride,
    dGT_ptr,
    dGT_stride,
    n_rows,
    n_cols,
    eps: tl.constexpr = 1e-10,
    log_target: tl.constexpr = False,
    reduction: tl.constexpr = "batchmean",
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    Y_ptr += row * Y_stride
    GT_ptr += row * GT_stride
    dY_ptr += row * dY_stride
    dGT_ptr += row * dGT_stride

    dloss = tl.load(dLOSS_ptr + row)
    if reduction == "batchmean":
        dloss = dloss / n_cols  # BUG: batchmean divides by the row length, not the number of rows
    elif reduction == "mean":
        dloss = dloss / (n_rows * n_cols)

    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        gt = tl.load(GT_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if not log_target:
            dy = -gt
            dgt = tl.log(max(gt, eps)) - y + 1.0
        else:
            p = tl.exp(gt)
            dy = -p
            dgt = p * (gt - y + 1.0)
        tl.store(dY_ptr + offsets, dy * dloss, mask=mask)
        tl.store(dGT_ptr + offsets, dgt * dloss, mask=mask)


@triton.jit
def _kl_div_bwd_kernel_broken_log_target(
    Y_ptr,
    Y_stride,
    GT_ptr,
    GT_stride,
    dLOSS_ptr,
    dY_ptr,
    dY_stride,
    dGT_ptr,
    dGT_stride,
    n_rows,
    n_cols,
    eps: tl.constexpr = 1e-10,
    log_target: tl.constexpr = False,
    reduction: tl.constexpr = "batchmean",
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    Y_ptr += row * Y_stride
    GT_ptr += row * GT_stride
    dY_ptr += row * dY_stride
    dGT_ptr += row * dGT_stride

    dloss = tl.load(dLOSS_ptr + row)
    if reduction == "batchmean":
        dloss = dloss / n_rows
    elif reduction == "mean":
        dloss = dloss / (n_rows * n_cols)

    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        gt = tl.load(GT_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if not log_target:
            dy = -gt
            dgt = tl.log(max(gt, eps)) - y + 1.0
        else:
            p = tl.exp(gt)
            dy = -p
            dgt = p * (gt - y)  # BUG: drops the derivative of exp(gt) itself
        tl.store(dY_ptr + offsets, dy * dloss, mask=mask)
        tl.store(dGT_ptr + offsets, dgt * dloss, mask=mask)

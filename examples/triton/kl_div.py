"""KL-divergence loss in the style of fused-loss libraries: one row of log-probabilities per
program, summed over column blocks in a `while` loop; `log_target` is a bool constexpr (the
target given as log-probabilities), `reduction` a string constexpr compared with `==`, `eps` a
float constexpr clamping the target inside the log (Python's `max` on a tensor).

    loss[r] = sum_j gt[r, j] * (log(gt[r, j]) - y[r, j])        (log_target = False)
    loss[r] = sum_j exp(gt[r, j]) * (gt[r, j] - y[r, j])        (log_target = True)

divided by `n_rows` for "batchmean", by `n_rows * n_cols` for "mean", kept for "sum".
"""
import triton
import triton.language as tl


@triton.jit
def _kl_div_fwd_kernel(
    Y_ptr,
    Y_stride,
    GT_ptr,
    GT_stride,
    LOSS_ptr,
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

    total = 0.0
    start = 0
    while start < n_cols:
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        y = tl.load(Y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        gt = tl.load(GT_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if not log_target:
            kl = gt * (tl.log(max(gt, eps)) - y)
        else:
            kl = tl.exp(gt) * (gt - y)
        total += tl.sum(tl.where(mask, kl, 0.0))
        start += BLOCK_SIZE

    if reduction == "batchmean":
        total = total / n_rows
    elif reduction == "mean":
        total = total / (n_rows * n_cols)
    tl.store(LOSS_ptr + row, total)

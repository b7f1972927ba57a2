"""Binary cross entropy on logits in the style of fused multi-label losses: one row per program,
column blocks in a loop, each row's loss the mean over its columns. The log-sigmoid is computed
stably (`max(-x, 0) + log1p(exp(-|x|))`, Python's `max` and `abs` on tensors) with `log1p` from
libdevice, imported under an `if` on the Triton version; `pos_weight: tl.constexpr = None`
weighs the positive term when bound.

    sp = softplus(-x),  loss[r] = mean_j (1 - t) x + (1 + (pos_weight - 1) t) sp
"""
import triton
import triton.language as tl

if triton.__version__ >= "3.0":
    from triton.language.extra import libdevice
else:
    from triton.language import math as libdevice


@triton.jit
def _bce_logits_fwd(
    X_ptr,
    T_ptr,
    LOSS_ptr,
    stride,
    n_cols,
    pos_weight: tl.constexpr = None,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * stride
    T_ptr += row * stride
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        x = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(T_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        softplus_neg = max(-x, 0.0) + libdevice.log1p(tl.exp(-abs(x)))
        if pos_weight is None:
            loss = (1.0 - t) * x + softplus_neg
        else:
            loss = (1.0 - t) * x + (1.0 + (pos_weight - 1.0) * t) * softplus_neg
        acc += tl.where(mask, loss, 0.0)
    tl.store(LOSS_ptr + row, tl.sum(acc, axis=0) / n_cols)

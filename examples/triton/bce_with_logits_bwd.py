"""Backward of bce_with_logits.py (g = dloss[r] / n_cols, w = 1 + (pos_weight - 1) t, or 1
without pos_weight):

    dx = ((1 - t) - w * sigmoid(-x)) * g
    dt = (-x + (pos_weight - 1) * softplus(-x)) * g       (dt = -x * g without pos_weight)

`_bce_logits_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl

if triton.__version__ >= "3.0":
    from triton.language.extra import libdevice
else:
    from triton.language import math as libdevice


@triton.jit
def _bce_logits_bwd(
    X_ptr,
    T_ptr,
    dLOSS_ptr,
    dX_ptr,
    dT_ptr,
    stride,
    n_cols,
    pos_weight: tl.constexpr = None,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * stride
    T_ptr += row * stride
    dX_ptr += row * stride
    dT_ptr += row * stride
    g = tl.load(dLOSS_ptr + row) / n_cols
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        x = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(T_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        softplus_neg = max(-x, 0.0) + libdevice.log1p(tl.exp(-abs(x)))
        sig_neg = tl.sigmoid(-x)
        if pos_weight is None:
            dx = (1.0 - t) - sig_neg
            dt = -x
        else:
            w = 1.0 + (pos_weight - 1.0) * t
            dx = (1.0 - t) - w * sig_neg
            dt = -x + (pos_weight - 1.0) * softplus_neg
        tl.store(dX_ptr + offsets, dx * g, mask=mask)
        tl.store(dT_ptr + offsets, dt * g, mask=mask)


@triton.jit
def _bce_logits_bwd_broken_pos_weight(
    X_ptr,
    T_ptr,
    dLOSS_ptr,
    dX_ptr,
    dT_ptr,
    stride,
    n_cols,
    pos_weight: tl.constexpr = None,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * stride
    T_ptr += row * stride
    dX_ptr += row * stride
    dT_ptr += row * stride
    g = tl.load(dLOSS_ptr + row) / n_cols
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        x = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(T_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        softplus_neg = max(-x, 0.0) + libdevice.log1p(tl.exp(-abs(x)))
        sig_neg = tl.sigmoid(-x)
        if pos_weight is None:
            dx = (1.0 - t) - sig_neg
            dt = -x
        else:
            w = 1.0 + (pos_weight - 1.0) * t
            dx = (1.0 - t) - sig_neg  # BUG: forgets the positive weight in dx
            dt = -x + (pos_weight - 1.0) * softplus_neg
        tl.store(dX_ptr + offsets, dx * g, mask=mask)
        tl.store(dT_ptr + offsets, dt * g, mask=mask)


@triton.jit
def _bce_logits_bwd_broken_mean(
    X_ptr,
    T_ptr,
    dLOSS_ptr,
    dX_ptr,
    dT_ptr,
    stride,
    n_cols,
    pos_weight: tl.constexpr = None,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X_ptr += row * stride
    T_ptr += row * stride
    dX_ptr += row * stride
    dT_ptr += row * stride
    g = tl.load(dLOSS_ptr + row)  # BUG: forgets the mean over the columns
    for start in range(0, n_cols, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_cols
        x = tl.load(X_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(T_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        softplus_neg = max(-x, 0.0) + libdevice.log1p(tl.exp(-abs(x)))
        sig_neg = tl.sigmoid(-x)
        if pos_weight is None:
            dx = (1.0 - t) - sig_neg
            dt = -x
        else:
            w = 1.0 + (pos_weight - 1.0) * t
            dx = (1.0 - t) - w * sig_neg
            dt = -x + (pos_weight - 1.0) * softplus_neg
        tl.store(dX_ptr + offsets, dx * g, mask=mask)
        tl.store(dT_ptr + offsets, dt * g, mask=mask)

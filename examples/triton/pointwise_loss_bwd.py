"""Backward of pointwise_loss.py (g: the loss's cotangent per element for "none", the scalar's
divided by n_elements for "mean", times `scale` when given; d = x - t):

    mse: 2 d g      huber: clamp(d, -delta, delta) g      smooth_l1: clamp(d / delta, -1, 1) g
    grad_input = that, grad_target = -that

`_pointwise_loss_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _pointwise_loss_bwd(
    INPUT,
    TARGET,
    DLOSS,
    DINPUT,
    DTARGET,
    n_elements,
    LOSS_TYPE: tl.constexpr = "mse",
    delta: tl.constexpr = 1.0,
    reduction: tl.constexpr = "mean",
    scale: tl.constexpr = None,
    BLOCK: tl.constexpr = 1024,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(INPUT + offsets, mask=mask, other=0.0)
    t = tl.load(TARGET + offsets, mask=mask, other=0.0)
    diff = tl.float32(x) - tl.float32(t)
    if reduction == "none":
        g = tl.load(DLOSS + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        g = tl.load(DLOSS).to(tl.float32)
        if reduction == "mean":
            g = g / n_elements
    if scale is not None:
        g = g * scale

    if LOSS_TYPE == "mse":
        d = 2.0 * diff
    elif LOSS_TYPE == "huber":
        d = min(max(diff, -delta), delta)
    else:
        d = min(max(diff / delta, -1.0), 1.0)
    grad = d * g
    tl.store(DINPUT + offsets, grad.to(DINPUT.dtype.element_ty), mask=mask)
    tl.store(DTARGET + offsets, (-grad).to(DTARGET.dtype.element_ty), mask=mask)


@triton.jit
def _pointwise_loss_bwd_broken_sign(
    INPUT,
    TARGET,
    DLOSS,
    DINPUT,
    DTARGET,
    n_elements,
    LOSS_TYPE: tl.constexpr = "mse",
    delta: tl.constexpr = 1.0,
    reduction: tl.constexpr = "mean",
    scale: tl.constexpr = None,
    BLOCK: tl.constexpr = 1024,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(INPUT + offsets, mask=mask, other=0.0)
    t = tl.load(TARGET + offsets, mask=mask, other=0.0)
    diff = tl.float32(x) - tl.float32(t)
    if reduction == "none":
        g = tl.load(DLOSS + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        g = tl.load(DLOSS).to(tl.float32)
        if reduction == "mean":
            g = g / n_elements
    if scale is not None:
        g = g * scale

    if LOSS_TYPE == "mse":
        d = 2.0 * diff
    elif LOSS_TYPE == "huber":
        d = min(max(diff, -delta), delta)
    else:
        d = min(max(diff / delta, -1.0), 1.0)
    grad = d * g
    tl.store(DINPUT + offsets, grad.to(DINPUT.dtype.element_ty), mask=mask)
    tl.store(DTARGET + offsets, grad.to(DTARGET.dtype.element_ty), mask=mask)  # BUG: the target enters the loss with a minus sign


@triton.jit
def _pointwise_loss_bwd_broken_delta(
    INPUT,
    TARGET,
    DLOSS,
    DINPUT,
    DTARGET,
    n_elements,
    LOSS_TYPE: tl.constexpr = "mse",
    delta: tl.constexpr = 1.0,
    reduction: tl.constexpr = "mean",
    scale: tl.constexpr = None,
    BLOCK: tl.constexpr = 1024,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(INPUT + offsets, mask=mask, other=0.0)
    t = tl.load(TARGET + offsets, mask=mask, other=0.0)
    diff = tl.float32(x) - tl.float32(t)
    if reduction == "none":
        g = tl.load(DLOSS + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        g = tl.load(DLOSS).to(tl.float32)
        if reduction == "mean":
            g = g / n_elements
    if scale is not None:
        g = g * scale

    if LOSS_TYPE == "mse":
        d = 2.0 * diff
    elif LOSS_TYPE == "huber":
        d = min(max(diff, -1.0), 1.0)  # BUG: clamps at 1 as smooth L1 does, not at delta
    else:
        d = min(max(diff / delta, -1.0), 1.0)
    grad = d * g
    tl.store(DINPUT + offsets, grad.to(DINPUT.dtype.element_ty), mask=mask)
    tl.store(DTARGET + offsets, (-grad).to(DTARGET.dtype.element_ty), mask=mask)


@triton.jit
def _pointwise_loss_bwd_broken_mask(
    INPUT,
    TARGET,
    DLOSS,
    DINPUT,
    DTARGET,
    n_elements,
    LOSS_TYPE: tl.constexpr = "mse",
    delta: tl.constexpr = 1.0,
    reduction: tl.constexpr = "mean",
    scale: tl.constexpr = None,
    BLOCK: tl.constexpr = 1024,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements - 1  # BUG: off by one: the last element is never written
    x = tl.load(INPUT + offsets, mask=mask, other=0.0)
    t = tl.load(TARGET + offsets, mask=mask, other=0.0)
    diff = tl.float32(x) - tl.float32(t)
    if reduction == "none":
        g = tl.load(DLOSS + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        g = tl.load(DLOSS).to(tl.float32)
        if reduction == "mean":
            g = g / n_elements
    if scale is not None:
        g = g * scale

    if LOSS_TYPE == "mse":
        d = 2.0 * diff
    elif LOSS_TYPE == "huber":
        d = min(max(diff, -delta), delta)
    else:
        d = min(max(diff / delta, -1.0), 1.0)
    grad = d * g
    tl.store(DINPUT + offsets, grad.to(DINPUT.dtype.element_ty), mask=mask)
    tl.store(DTARGET + offsets, (-grad).to(DTARGET.dtype.element_ty), mask=mask)

"""Elementwise regression losses in the style of fused-loss kernels, chosen by string
constexprs: `LOSS_TYPE` ("mse", "huber", "smooth_l1") with the float constexpr `delta`,
`reduction` ("none" stores one loss per element; "sum" and "mean" reduce each block and
`tl.atomic_add` it into a scalar), and `scale: tl.constexpr = None` (an optional loss weight).
Inputs are cast with `tl.float32(x)`; `abs` is Python's builtin on a tensor.
"""
import triton
import triton.language as tl


@triton.jit
def _pointwise_loss_fwd(
    INPUT,
    TARGET,
    LOSS,
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
    ad = abs(diff)
    if LOSS_TYPE == "mse":
        loss = diff * diff
    elif LOSS_TYPE == "huber":
        loss = tl.where(ad < delta, 0.5 * diff * diff, delta * (ad - 0.5 * delta))
    else:
        loss = tl.where(ad < delta, 0.5 * diff * diff / delta, ad - 0.5 * delta)
    if scale is not None:
        loss = loss * scale

    if reduction == "none":
        tl.store(LOSS + offsets, loss.to(LOSS.dtype.element_ty), mask=mask)
    else:
        block_loss = tl.sum(tl.where(mask, loss, 0.0), axis=0)
        if reduction == "mean":
            block_loss = block_loss / n_elements
        tl.atomic_add(LOSS, block_loss)

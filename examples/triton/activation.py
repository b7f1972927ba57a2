"""Elementwise activations selected by a string constexpr, in the style of fused-activation
libraries: `ACTIVATION: tl.constexpr = None` is the identity, "leaky_relu" uses the float
constexpr `negative_slope`, "relu6" clamps with Python's `min`/`max` on tensors, and
"tanh_gelu" uses libdevice `tanh`. The pointers are named `X` and `Y` (no `_ptr`), and the
kernel is made by applying `triton.jit` (under `triton.heuristics`) as a call, not a decorator.
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice


def _activation_fwd(X, Y, n_elements, negative_slope: tl.constexpr = 0.01, ACTIVATION: tl.constexpr = None,
                    BLOCK: tl.constexpr = 1024):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == "leaky_relu":
        y = tl.where(x >= 0, x, x * negative_slope)
    elif ACTIVATION == "relu6":
        y = min(max(x, 0.0), 6.0)
    elif ACTIVATION == "tanh_gelu":
        y = 0.5 * x * (1 + libdevice.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    else:
        y = x
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


activation_fwd = triton.heuristics({"BLOCK": lambda args: min(triton.next_power_of_2(args["n_elements"]), 1024)})(
    triton.jit(_activation_fwd)
)

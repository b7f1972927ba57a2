"""Helpers of glu.py and glu_bwd.py, imported from beside them (`from glu_utils import ...`).
`tanh` comes from libdevice under whichever import path the installed Triton has."""
import triton
import triton.language as tl

try:
    from triton.language.extra.libdevice import tanh
except ImportError:
    try:
        from triton.language.extra.cuda.libdevice import tanh
    except ImportError:
        from triton.language.math import tanh


@triton.jit
def gelu_tanh(a):
    """Tanh-approximated GELU of `a` and the tanh it went through."""
    sqrt_2_over_pi = 0.7978845608028654
    t = tanh(sqrt_2_over_pi * (a + 0.044715 * a * a * a))
    return 0.5 * a * (1.0 + t), t

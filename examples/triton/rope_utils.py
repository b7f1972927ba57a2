"""Helpers of rope.py and rope_bwd.py, imported from beside them (`from .rope_utils import ...`)."""
import triton
import triton.language as tl


@triton.jit
def rotate_pair(x1, x2, cos, sin):
    """Rotates each (x1, x2) pair by the angle whose cosine and sine are given."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def half_offsets(BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, head_stride):
    """Offsets of a [BLOCK_H, BLOCK_D] tile of heads by half-head columns."""
    return tl.arange(0, BLOCK_H)[:, None] * head_stride + tl.arange(0, BLOCK_D)[None, :]

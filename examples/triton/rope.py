"""Rotary position embedding in the style of fused-RoPE kernels: one program per (token, block of
heads); each head's first and second halves are rotated by the token's cos/sin. The rotation
helpers live in a sibling module and are imported relatively.

    out[t, h, :half] = q1 * cos[t] - q2 * sin[t],  out[t, h, half:] = q2 * cos[t] + q1 * sin[t]
"""
import triton
import triton.language as tl

from .rope_utils import half_offsets, rotate_pair


def _rope_embedding(
    Q,
    Q_row_stride,
    OUT,
    OUT_row_stride,
    cos,
    cos_row_stride,
    sin,
    sin_row_stride,
    seqlen,
    n_heads,
    head_dim: tl.constexpr,
    BACKWARD_PASS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row_position = tl.program_id(0)
    group_head_position = tl.program_id(1)
    half_head_dim = head_dim // 2
    col_offsets = tl.arange(0, BLOCK_D)
    col_mask = col_offsets < half_head_dim

    sin1 = tl.load(sin + (row_position % seqlen) * sin_row_stride + col_offsets, mask=col_mask, other=0)
    cos1 = tl.load(cos + (row_position % seqlen) * cos_row_stride + col_offsets, mask=col_mask, other=0)
    if BACKWARD_PASS:
        # The inverse rotation.
        sin1 = -sin1

    heads = group_head_position * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (heads[:, None] < n_heads) & col_mask[None, :]
    offs = group_head_position * BLOCK_H * head_dim + half_offsets(BLOCK_H, BLOCK_D, head_dim)
    q1 = tl.load(Q + row_position * Q_row_stride + offs, mask=mask, other=0).to(sin1.dtype)
    q2 = tl.load(Q + row_position * Q_row_stride + offs + half_head_dim, mask=mask, other=0).to(sin1.dtype)
    o1, o2 = rotate_pair(q1, q2, cos1[None, :], sin1[None, :])
    tl.store(OUT + row_position * OUT_row_stride + offs, o1, mask=mask)
    tl.store(OUT + row_position * OUT_row_stride + offs + half_head_dim, o2, mask=mask)


_rope_embedding = triton.jit(_rope_embedding)

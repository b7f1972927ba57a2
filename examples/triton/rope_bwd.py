"""Backward of rope.py: the rotation is orthogonal, so the gradient is the inverse rotation of the
output's gradient (the forward kernel itself with BACKWARD_PASS=True negates sin). This file's
kernel writes it out, reusing the helpers of rope_utils.py.

`_rope_backward_broken_*` variants differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl

from .rope_utils import half_offsets, rotate_pair


@triton.jit
def _rope_backward(
    DY,
    DY_row_stride,
    DQ,
    DQ_row_stride,
    cos,
    cos_row_stride,
    sin,
    sin_row_stride,
    seqlen,
    n_heads,
    head_dim: tl.constexpr,
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
    heads = group_head_position * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (heads[:, None] < n_heads) & col_mask[None, :]
    offs = group_head_position * BLOCK_H * head_dim + half_offsets(BLOCK_H, BLOCK_D, head_dim)
    dy1 = tl.load(DY + row_position * DY_row_stride + offs, mask=mask, other=0).to(tl.float32)
    dy2 = tl.load(DY + row_position * DY_row_stride + offs + half_head_dim, mask=mask, other=0).to(tl.float32)
    dq1, dq2 = rotate_pair(dy1, dy2, cos1[None, :], -sin1[None, :])
    tl.store(DQ + row_position * DQ_row_stride + offs, dq1, mask=mask)
    tl.store(DQ + row_position * DQ_row_stride + offs + half_head_dim, dq2, mask=mask)


@triton.jit
def _rope_backward_broken_sign(
    DY,
    DY_row_stride,
    DQ,
    DQ_row_stride,
    cos,
    cos_row_stride,
    sin,
    sin_row_stride,
    seqlen,
    n_heads,
    head_dim: tl.constexpr,
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
    heads = group_head_position * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (heads[:, None] < n_heads) & col_mask[None, :]
    offs = group_head_position * BLOCK_H * head_dim + half_offsets(BLOCK_H, BLOCK_D, head_dim)
    dy1 = tl.load(DY + row_position * DY_row_stride + offs, mask=mask, other=0).to(tl.float32)
    dy2 = tl.load(DY + row_position * DY_row_stride + offs + half_head_dim, mask=mask, other=0).to(tl.float32)
    dq1, dq2 = rotate_pair(dy1, dy2, cos1[None, :], sin1[None, :])  # BUG: rotates forward, not back
    tl.store(DQ + row_position * DQ_row_stride + offs, dq1, mask=mask)
    tl.store(DQ + row_position * DQ_row_stride + offs + half_head_dim, dq2, mask=mask)

"""Backward of embedding.py: each program scatters its token's cotangent into row `ids[token]`
of grad_weight (zero-initialised) with `tl.atomic_add`, since tokens repeat ids; padding
tokens contribute nothing.

`_embedding_bwd_kernel_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _embedding_bwd_kernel(
    ids_ptr,
    grad_out_ptr,
    grad_weight_ptr,
    dim,
    grad_out_stride,
    grad_weight_stride,
    PADDING_IDX: tl.constexpr = None,
    BLOCK_D: tl.constexpr = 128,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < dim
    idx = tl.load(ids_ptr + token)
    if PADDING_IDX is not None:
        if idx == PADDING_IDX:
            return
    grad = tl.load(grad_out_ptr + token * grad_out_stride + cols, mask=mask, other=0.0)
    tl.atomic_add(grad_weight_ptr + idx * grad_weight_stride + cols, grad, mask=mask)


@triton.jit
def _embedding_bwd_kernel_broken_store(
    ids_ptr,
    grad_out_ptr,
    grad_weight_ptr,
    dim,
    grad_out_stride,
    grad_weight_stride,
    PADDING_IDX: tl.constexpr = None,
    BLOCK_D: tl.constexpr = 128,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < dim
    idx = tl.load(ids_ptr + token)
    if PADDING_IDX is not None:
        if idx == PADDING_IDX:
            return
    grad = tl.load(grad_out_ptr + token * grad_out_stride + cols, mask=mask, other=0.0)
    tl.store(grad_weight_ptr + idx * grad_weight_stride + cols, grad, mask=mask)  # BUG: a plain store: tokens sharing an id overwrite each other


@triton.jit
def _embedding_bwd_kernel_broken_padding(
    ids_ptr,
    grad_out_ptr,
    grad_weight_ptr,
    dim,
    grad_out_stride,
    grad_weight_stride,
    PADDING_IDX: tl.constexpr = None,
    BLOCK_D: tl.constexpr = 128,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < dim
    idx = tl.load(ids_ptr + token)
    if PADDING_IDX is not None:
        if token == PADDING_IDX:  # BUG: compares the token's position, not its id, with the padding index
            return
    grad = tl.load(grad_out_ptr + token * grad_out_stride + cols, mask=mask, other=0.0)
    tl.atomic_add(grad_weight_ptr + idx * grad_weight_stride + cols, grad, mask=mask)

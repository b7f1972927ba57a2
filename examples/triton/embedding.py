"""Embedding lookup in the style of fused-embedding kernels: one program per (token, block of
the embedding dimension) gathers row `ids[token]` of the table. `PADDING_IDX: tl.constexpr =
None` is off by default; when bound, tokens equal to it read zeros and return early (an `if` on
the runtime id inside an `if` on the constexpr).
"""
import triton
import triton.language as tl


@triton.jit
def _embedding_fwd_kernel(
    ids_ptr,
    weight_ptr,
    out_ptr,
    dim,
    weight_stride,
    out_stride,
    PADDING_IDX: tl.constexpr = None,
    BLOCK_D: tl.constexpr = 128,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < dim
    idx = tl.load(ids_ptr + token)
    if PADDING_IDX is not None:
        if idx == PADDING_IDX:
            tl.store(out_ptr + token * out_stride + cols, tl.zeros([BLOCK_D], dtype=tl.float32), mask=mask)
            return
    row = tl.load(weight_ptr + idx * weight_stride + cols, mask=mask, other=0.0)
    tl.store(out_ptr + token * out_stride + cols, row, mask=mask)

import triton
import triton.language as tl


@triton.jit
def weighted_sum_fwd(
    x_ptr, weight_ptr,  # inputs
    output_ptr,  # output
    x_stride_row, x_stride_dim,
    weight_stride_dim,
    output_stride_row,
    ROWS, D,
    ROWS_TILE_SIZE: tl.constexpr, D_TILE_SIZE: tl.constexpr,
):
    """The weighted-sum forward of weighted_sum.py with tensor descriptors (Triton >= 3.9).

    Each program reduces ROWS_TILE_SIZE rows of x against weight, one D tile at a time; the
    descriptors zero-fill the tiles past ROWS and D, and the store skips rows past ROWS.
    """
    row_tile_idx = tl.program_id(0)
    row0 = row_tile_idx * ROWS_TILE_SIZE
    x_desc = tl.make_tensor_descriptor(
        x_ptr,
        shape=[ROWS, D],
        strides=[x_stride_row, x_stride_dim],
        block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE],
    )
    weight_desc = tl.make_tensor_descriptor(
        base=weight_ptr, shape=[D], strides=[weight_stride_dim], block_shape=[D_TILE_SIZE],
    )
    output_desc = tl.make_tensor_descriptor(output_ptr, [ROWS], [output_stride_row], [ROWS_TILE_SIZE])
    output = tl.zeros((ROWS_TILE_SIZE,), dtype=tl.float32)
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        d0 = i * D_TILE_SIZE
        row = x_desc.load([row0, d0])
        weight = weight_desc.load((d0,))
        output += tl.sum(row * weight[None, :], axis=1)
    output_desc.store([row0], output)

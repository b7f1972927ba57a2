"""Backward of the tensor-descriptor weighted sum of weighted_sum_desc.py (Triton >= 3.9):
the same gradients as weighted_sum_bwd.py, grad_x[i, j] = weight[j] * grad_output[i] and one row
per program of a partial buffer [cdiv(ROWS, ROWS_TILE_SIZE), D] that the host sums over axis 0
into grad_weight, through descriptors (zero-filled loads, stores of the in-bounds elements only).

Each `weighted_sum_desc_bwd_broken_*` differs from `weighted_sum_desc_bwd` in one line, marked
with a comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def weighted_sum_desc_bwd(
    x_ptr, weight_ptr,  # forward inputs
    grad_output_ptr,  # cotangent of output
    grad_x_ptr, partial_grad_weight_ptr,  # gradients: grad_x, one row of grad_weight per program
    stride_xr, stride_xd,
    stride_wd,
    stride_gr,
    stride_gxr, stride_gxd,
    stride_gwb, stride_gwd,
    NUM_ROWS, D,
    ROWS_TILE_SIZE: tl.constexpr, D_TILE_SIZE: tl.constexpr,
):
    row_tile_idx = tl.program_id(0)
    n_row_tiles = tl.num_programs(0)
    row0 = row_tile_idx * ROWS_TILE_SIZE
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[NUM_ROWS, D], strides=[stride_xr, stride_xd],
                                       block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    weight_desc = tl.make_tensor_descriptor(weight_ptr, shape=[D], strides=[stride_wd], block_shape=[D_TILE_SIZE])
    grad_output_desc = tl.make_tensor_descriptor(grad_output_ptr, shape=[NUM_ROWS], strides=[stride_gr],
                                                 block_shape=[ROWS_TILE_SIZE])
    grad_x_desc = tl.make_tensor_descriptor(grad_x_ptr, shape=[NUM_ROWS, D], strides=[stride_gxr, stride_gxd],
                                            block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    partial_desc = tl.make_tensor_descriptor(partial_grad_weight_ptr, shape=[n_row_tiles, D],
                                             strides=[stride_gwb, stride_gwd], block_shape=[1, D_TILE_SIZE])
    grad_output = grad_output_desc.load([row0])
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        d0 = i * D_TILE_SIZE
        weight = weight_desc.load([d0])
        grad_x_desc.store([row0, d0], grad_output[:, None] * weight[None, :])
        x_tile = x_desc.load([row0, d0])
        partial_desc.store([row_tile_idx, d0], tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True))


@triton.jit
def weighted_sum_desc_bwd_broken_partial_row(
    x_ptr, weight_ptr,  # forward inputs
    grad_output_ptr,  # cotangent of output
    grad_x_ptr, partial_grad_weight_ptr,  # gradients: grad_x, one row of grad_weight per program
    stride_xr, stride_xd,
    stride_wd,
    stride_gr,
    stride_gxr, stride_gxd,
    stride_gwb, stride_gwd,
    NUM_ROWS, D,
    ROWS_TILE_SIZE: tl.constexpr, D_TILE_SIZE: tl.constexpr,
):
    row_tile_idx = tl.program_id(0)
    n_row_tiles = tl.num_programs(0)
    row0 = row_tile_idx * ROWS_TILE_SIZE
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[NUM_ROWS, D], strides=[stride_xr, stride_xd],
                                       block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    weight_desc = tl.make_tensor_descriptor(weight_ptr, shape=[D], strides=[stride_wd], block_shape=[D_TILE_SIZE])
    grad_output_desc = tl.make_tensor_descriptor(grad_output_ptr, shape=[NUM_ROWS], strides=[stride_gr],
                                                 block_shape=[ROWS_TILE_SIZE])
    grad_x_desc = tl.make_tensor_descriptor(grad_x_ptr, shape=[NUM_ROWS, D], strides=[stride_gxr, stride_gxd],
                                            block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    partial_desc = tl.make_tensor_descriptor(partial_grad_weight_ptr, shape=[n_row_tiles, D],
                                             strides=[stride_gwb, stride_gwd], block_shape=[1, D_TILE_SIZE])
    grad_output = grad_output_desc.load([row0])
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        d0 = i * D_TILE_SIZE
        weight = weight_desc.load([d0])
        grad_x_desc.store([row0, d0], grad_output[:, None] * weight[None, :])
        x_tile = x_desc.load([row0, d0])
        partial_desc.store([0, d0], tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True))  # BUG: row 0 for every program, not row row_tile_idx


@triton.jit
def weighted_sum_desc_bwd_broken_tile_offset(
    x_ptr, weight_ptr,  # forward inputs
    grad_output_ptr,  # cotangent of output
    grad_x_ptr, partial_grad_weight_ptr,  # gradients: grad_x, one row of grad_weight per program
    stride_xr, stride_xd,
    stride_wd,
    stride_gr,
    stride_gxr, stride_gxd,
    stride_gwb, stride_gwd,
    NUM_ROWS, D,
    ROWS_TILE_SIZE: tl.constexpr, D_TILE_SIZE: tl.constexpr,
):
    row_tile_idx = tl.program_id(0)
    n_row_tiles = tl.num_programs(0)
    row0 = row_tile_idx * ROWS_TILE_SIZE
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[NUM_ROWS, D], strides=[stride_xr, stride_xd],
                                       block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    weight_desc = tl.make_tensor_descriptor(weight_ptr, shape=[D], strides=[stride_wd], block_shape=[D_TILE_SIZE])
    grad_output_desc = tl.make_tensor_descriptor(grad_output_ptr, shape=[NUM_ROWS], strides=[stride_gr],
                                                 block_shape=[ROWS_TILE_SIZE])
    grad_x_desc = tl.make_tensor_descriptor(grad_x_ptr, shape=[NUM_ROWS, D], strides=[stride_gxr, stride_gxd],
                                            block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    partial_desc = tl.make_tensor_descriptor(partial_grad_weight_ptr, shape=[n_row_tiles, D],
                                             strides=[stride_gwb, stride_gwd], block_shape=[1, D_TILE_SIZE])
    grad_output = grad_output_desc.load([row0])
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        d0 = i  # BUG: tile index used as the column offset, not scaled by D_TILE_SIZE
        weight = weight_desc.load([d0])
        grad_x_desc.store([row0, d0], grad_output[:, None] * weight[None, :])
        x_tile = x_desc.load([row0, d0])
        partial_desc.store([row_tile_idx, d0], tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True))


@triton.jit
def weighted_sum_desc_bwd_broken_stride(
    x_ptr, weight_ptr,  # forward inputs
    grad_output_ptr,  # cotangent of output
    grad_x_ptr, partial_grad_weight_ptr,  # gradients: grad_x, one row of grad_weight per program
    stride_xr, stride_xd,
    stride_wd,
    stride_gr,
    stride_gxr, stride_gxd,
    stride_gwb, stride_gwd,
    NUM_ROWS, D,
    ROWS_TILE_SIZE: tl.constexpr, D_TILE_SIZE: tl.constexpr,
):
    row_tile_idx = tl.program_id(0)
    n_row_tiles = tl.num_programs(0)
    row0 = row_tile_idx * ROWS_TILE_SIZE
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[NUM_ROWS, D], strides=[stride_xr, stride_xd],
                                       block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    weight_desc = tl.make_tensor_descriptor(weight_ptr, shape=[D], strides=[stride_wd], block_shape=[D_TILE_SIZE])
    grad_output_desc = tl.make_tensor_descriptor(grad_output_ptr, shape=[NUM_ROWS], strides=[stride_xr],  # BUG: x's row stride for grad_output
                                                 block_shape=[ROWS_TILE_SIZE])
    grad_x_desc = tl.make_tensor_descriptor(grad_x_ptr, shape=[NUM_ROWS, D], strides=[stride_gxr, stride_gxd],
                                            block_shape=[ROWS_TILE_SIZE, D_TILE_SIZE])
    partial_desc = tl.make_tensor_descriptor(partial_grad_weight_ptr, shape=[n_row_tiles, D],
                                             strides=[stride_gwb, stride_gwd], block_shape=[1, D_TILE_SIZE])
    grad_output = grad_output_desc.load([row0])
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        d0 = i * D_TILE_SIZE
        weight = weight_desc.load([d0])
        grad_x_desc.store([row0, d0], grad_output[:, None] * weight[None, :])
        x_tile = x_desc.load([row0, d0])
        partial_desc.store([row_tile_idx, d0], tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True))

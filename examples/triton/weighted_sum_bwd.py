"""Backward of weighted_sum_fwd (output[i] = sum_j x[i, j] * weight[j]) with block pointers.

`weighted_sum_bwd` is correct: grad_x[i, j] = weight[j] * grad_output[i] directly, and
partial_grad_weight[t, j] = sum over the rows i of row tile t of x[i, j] * grad_output[i], one row
per program of a partial buffer [cdiv(ROWS, ROWS_TILE_SIZE), D] that the host sums over axis 0
into grad_weight. Each `weighted_sum_bwd_broken_*` differs from it in one line, marked with a
comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def weighted_sum_bwd(
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
    grad_output_block_ptr = tl.make_block_ptr(
        grad_output_ptr, shape=(NUM_ROWS,), strides=(stride_gr,), offsets=(row_tile_idx * ROWS_TILE_SIZE,),
        block_shape=(ROWS_TILE_SIZE,), order=(0,),
    )
    x_block_ptr = tl.make_block_ptr(
        x_ptr, shape=(NUM_ROWS, D), strides=(stride_xr, stride_xd), offsets=(row_tile_idx * ROWS_TILE_SIZE, 0),
        block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    weight_block_ptr = tl.make_block_ptr(
        weight_ptr, shape=(D,), strides=(stride_wd,), offsets=(0,), block_shape=(D_TILE_SIZE,), order=(0,),
    )
    grad_x_block_ptr = tl.make_block_ptr(
        grad_x_ptr, shape=(NUM_ROWS, D), strides=(stride_gxr, stride_gxd),
        offsets=(row_tile_idx * ROWS_TILE_SIZE, 0), block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    partial_grad_weight_block_ptr = tl.make_block_ptr(
        partial_grad_weight_ptr, shape=(n_row_tiles, D), strides=(stride_gwb, stride_gwd),
        offsets=(row_tile_idx, 0), block_shape=(1, D_TILE_SIZE), order=(1, 0),
    )
    grad_output = tl.load(grad_output_block_ptr, boundary_check=(0,), padding_option="zero")
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        weight = tl.load(weight_block_ptr, boundary_check=(0,), padding_option="zero")
        grad_x_tile = grad_output[:, None] * weight[None, :]
        tl.store(grad_x_block_ptr, grad_x_tile, boundary_check=(0, 1))
        x_tile = tl.load(x_block_ptr, boundary_check=(0, 1), padding_option="zero")
        grad_weight_tile = tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True)
        tl.store(partial_grad_weight_block_ptr, grad_weight_tile, boundary_check=(1,))
        x_block_ptr = tl.advance(x_block_ptr, (0, D_TILE_SIZE))
        weight_block_ptr = tl.advance(weight_block_ptr, (D_TILE_SIZE,))
        grad_x_block_ptr = tl.advance(grad_x_block_ptr, (0, D_TILE_SIZE))
        partial_grad_weight_block_ptr = tl.advance(partial_grad_weight_block_ptr, (0, D_TILE_SIZE))


@triton.jit
def weighted_sum_bwd_broken_partial_row(
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
    grad_output_block_ptr = tl.make_block_ptr(
        grad_output_ptr, shape=(NUM_ROWS,), strides=(stride_gr,), offsets=(row_tile_idx * ROWS_TILE_SIZE,),
        block_shape=(ROWS_TILE_SIZE,), order=(0,),
    )
    x_block_ptr = tl.make_block_ptr(
        x_ptr, shape=(NUM_ROWS, D), strides=(stride_xr, stride_xd), offsets=(row_tile_idx * ROWS_TILE_SIZE, 0),
        block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    weight_block_ptr = tl.make_block_ptr(
        weight_ptr, shape=(D,), strides=(stride_wd,), offsets=(0,), block_shape=(D_TILE_SIZE,), order=(0,),
    )
    grad_x_block_ptr = tl.make_block_ptr(
        grad_x_ptr, shape=(NUM_ROWS, D), strides=(stride_gxr, stride_gxd),
        offsets=(row_tile_idx * ROWS_TILE_SIZE, 0), block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    partial_grad_weight_block_ptr = tl.make_block_ptr(
        partial_grad_weight_ptr, shape=(n_row_tiles, D), strides=(stride_gwb, stride_gwd),
        offsets=(0, 0), block_shape=(1, D_TILE_SIZE), order=(1, 0),  # BUG: row 0 for every program, not row row_tile_idx
    )
    grad_output = tl.load(grad_output_block_ptr, boundary_check=(0,), padding_option="zero")
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        weight = tl.load(weight_block_ptr, boundary_check=(0,), padding_option="zero")
        grad_x_tile = grad_output[:, None] * weight[None, :]
        tl.store(grad_x_block_ptr, grad_x_tile, boundary_check=(0, 1))
        x_tile = tl.load(x_block_ptr, boundary_check=(0, 1), padding_option="zero")
        grad_weight_tile = tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True)
        tl.store(partial_grad_weight_block_ptr, grad_weight_tile, boundary_check=(1,))
        x_block_ptr = tl.advance(x_block_ptr, (0, D_TILE_SIZE))
        weight_block_ptr = tl.advance(weight_block_ptr, (D_TILE_SIZE,))
        grad_x_block_ptr = tl.advance(grad_x_block_ptr, (0, D_TILE_SIZE))
        partial_grad_weight_block_ptr = tl.advance(partial_grad_weight_block_ptr, (0, D_TILE_SIZE))


@triton.jit
def weighted_sum_bwd_broken_no_advance(
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
    grad_output_block_ptr = tl.make_block_ptr(
        grad_output_ptr, shape=(NUM_ROWS,), strides=(stride_gr,), offsets=(row_tile_idx * ROWS_TILE_SIZE,),
        block_shape=(ROWS_TILE_SIZE,), order=(0,),
    )
    x_block_ptr = tl.make_block_ptr(
        x_ptr, shape=(NUM_ROWS, D), strides=(stride_xr, stride_xd), offsets=(row_tile_idx * ROWS_TILE_SIZE, 0),
        block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    weight_block_ptr = tl.make_block_ptr(
        weight_ptr, shape=(D,), strides=(stride_wd,), offsets=(0,), block_shape=(D_TILE_SIZE,), order=(0,),
    )
    grad_x_block_ptr = tl.make_block_ptr(
        grad_x_ptr, shape=(NUM_ROWS, D), strides=(stride_gxr, stride_gxd),
        offsets=(row_tile_idx * ROWS_TILE_SIZE, 0), block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    partial_grad_weight_block_ptr = tl.make_block_ptr(
        partial_grad_weight_ptr, shape=(n_row_tiles, D), strides=(stride_gwb, stride_gwd),
        offsets=(row_tile_idx, 0), block_shape=(1, D_TILE_SIZE), order=(1, 0),
    )
    grad_output = tl.load(grad_output_block_ptr, boundary_check=(0,), padding_option="zero")
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        weight = tl.load(weight_block_ptr, boundary_check=(0,), padding_option="zero")
        grad_x_tile = grad_output[:, None] * weight[None, :]
        tl.store(grad_x_block_ptr, grad_x_tile, boundary_check=(0, 1))
        x_tile = tl.load(x_block_ptr, boundary_check=(0, 1), padding_option="zero")
        grad_weight_tile = tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True)
        tl.store(partial_grad_weight_block_ptr, grad_weight_tile, boundary_check=(1,))
        x_block_ptr = tl.advance(x_block_ptr, (0, D_TILE_SIZE))
        weight_block_ptr = tl.advance(weight_block_ptr, (D_TILE_SIZE,))
        grad_x_block_ptr = tl.advance(grad_x_block_ptr, (0, D_TILE_SIZE))
        partial_grad_weight_block_ptr = tl.advance(partial_grad_weight_block_ptr, (0, 0))  # BUG: not advanced, every D tile overwrites the first one


@triton.jit
def weighted_sum_bwd_broken_boundary(
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
    grad_output_block_ptr = tl.make_block_ptr(
        grad_output_ptr, shape=(NUM_ROWS,), strides=(stride_gr,), offsets=(row_tile_idx * ROWS_TILE_SIZE,),
        block_shape=(ROWS_TILE_SIZE,), order=(0,),
    )
    x_block_ptr = tl.make_block_ptr(
        x_ptr, shape=(NUM_ROWS, D), strides=(stride_xr, stride_xd), offsets=(row_tile_idx * ROWS_TILE_SIZE, 0),
        block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    weight_block_ptr = tl.make_block_ptr(
        weight_ptr, shape=(D,), strides=(stride_wd,), offsets=(0,), block_shape=(D_TILE_SIZE,), order=(0,),
    )
    grad_x_block_ptr = tl.make_block_ptr(
        grad_x_ptr, shape=(NUM_ROWS, D), strides=(stride_gxr, stride_gxd),
        offsets=(row_tile_idx * ROWS_TILE_SIZE, 0), block_shape=(ROWS_TILE_SIZE, D_TILE_SIZE), order=(1, 0),
    )
    partial_grad_weight_block_ptr = tl.make_block_ptr(
        partial_grad_weight_ptr, shape=(n_row_tiles, D), strides=(stride_gwb, stride_gwd),
        offsets=(row_tile_idx, 0), block_shape=(1, D_TILE_SIZE), order=(1, 0),
    )
    grad_output = tl.load(grad_output_block_ptr, boundary_check=(0,), padding_option="zero")
    for i in range(tl.cdiv(D, D_TILE_SIZE)):
        weight = tl.load(weight_block_ptr, boundary_check=(0,), padding_option="zero")
        grad_x_tile = grad_output[:, None] * weight[None, :]
        tl.store(grad_x_block_ptr, grad_x_tile, boundary_check=(0,))  # BUG: no boundary check on D, the last D tile writes past the row
        x_tile = tl.load(x_block_ptr, boundary_check=(0, 1), padding_option="zero")
        grad_weight_tile = tl.sum(x_tile * grad_output[:, None], axis=0, keep_dims=True)
        tl.store(partial_grad_weight_block_ptr, grad_weight_tile, boundary_check=(1,))
        x_block_ptr = tl.advance(x_block_ptr, (0, D_TILE_SIZE))
        weight_block_ptr = tl.advance(weight_block_ptr, (D_TILE_SIZE,))
        grad_x_block_ptr = tl.advance(grad_x_block_ptr, (0, D_TILE_SIZE))
        partial_grad_weight_block_ptr = tl.advance(partial_grad_weight_block_ptr, (0, D_TILE_SIZE))

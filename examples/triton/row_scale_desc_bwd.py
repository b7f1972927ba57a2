import triton
import triton.language as tl


@triton.jit
def row_scale_bwd(x_desc, w_ptr, dy_desc, dx_desc, partial_dw_ptr, partial_db_ptr, N,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Backward of row_scale_fwd with host-built descriptors (`desc.load` / `desc.store`):
    grad_x tile by tile, and one row of partial grad_w / grad_b per row tile, summed on the host."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    x = x_desc.load([m0, n0])
    dy = dy_desc.load([m0, n0])
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.)
    t = tl.math.tanh(x * w[None, :])
    dz = dy * (1 - t * t)
    dx_desc.store([m0, n0], dz * w[None, :])
    tl.store(partial_dw_ptr + pid_m * N + cols, tl.sum(dz * x, axis=0), mask=cols < N)
    tl.store(partial_db_ptr + pid_m * N + cols, tl.sum(dy, axis=0), mask=cols < N)


@triton.jit
def row_scale_bwd_broken_offsets(x_desc, w_ptr, dy_desc, dx_desc, partial_dw_ptr, partial_db_ptr, N,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """grad_x stored at the offsets of the transposed tile grid."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    x = x_desc.load([m0, n0])
    dy = dy_desc.load([m0, n0])
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.)
    t = tl.math.tanh(x * w[None, :])
    dz = dy * (1 - t * t)
    dx_desc.store([pid_n * BLOCK_M, pid_m * BLOCK_N], dz * w[None, :])  # BUG: tile offsets swapped
    tl.store(partial_dw_ptr + pid_m * N + cols, tl.sum(dz * x, axis=0), mask=cols < N)
    tl.store(partial_db_ptr + pid_m * N + cols, tl.sum(dy, axis=0), mask=cols < N)


@triton.jit
def row_scale_bwd_broken_tanh(x_desc, w_ptr, dy_desc, dx_desc, partial_dw_ptr, partial_db_ptr, N,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The derivative of tanh taken as 1 - t."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    x = x_desc.load([m0, n0])
    dy = dy_desc.load([m0, n0])
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.)
    t = tl.math.tanh(x * w[None, :])
    dz = dy * (1 - t)  # BUG: d tanh = 1 - t^2, not 1 - t
    dx_desc.store([m0, n0], dz * w[None, :])
    tl.store(partial_dw_ptr + pid_m * N + cols, tl.sum(dz * x, axis=0), mask=cols < N)
    tl.store(partial_db_ptr + pid_m * N + cols, tl.sum(dy, axis=0), mask=cols < N)

import triton
import triton.language as tl


@triton.jit
def layer_norm_bwd_dx_fused(grad_x_ptr, grad_y_ptr, partial_dw_ptr, partial_db_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
                            lock_ptr, stride, N, GROUP_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Layer-norm backward in the style of the Triton tutorial: one row per program writes grad_x
    and adds its dy * xhat and dy rows into row `row % GROUP_SIZE_M` of the partial dw/db buffers,
    shared by the programs of that group and guarded by a spin lock; the group's count flag tells
    the first writer, which stores instead of accumulating."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE_N)
    mask = cols < N
    x_ptr += row * stride
    grad_y_ptr += row * stride
    grad_x_ptr += row * stride
    group = row % GROUP_SIZE_M
    lock_ptr += group
    count_ptr = lock_ptr + GROUP_SIZE_M
    partial_dw_ptr += group * N + cols
    partial_db_ptr += group * N + cols
    x = tl.load(x_ptr + cols, mask=mask, other=0.).to(tl.float32)
    dy = tl.load(grad_y_ptr + cols, mask=mask, other=0.).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.)
    wdy = tl.where(mask, w * dy, 0.)
    c1 = tl.sum(xhat * wdy, axis=0) / N
    c2 = tl.sum(wdy, axis=0) / N
    dx = (wdy - (xhat * c1 + c2)) * rstd
    tl.store(grad_x_ptr + cols, dx, mask=mask)
    dw = (dy * xhat).to(w.dtype)
    db = dy.to(w.dtype)
    while tl.atomic_cas(lock_ptr, 0, 1) == 1:
        pass
    count = tl.load(count_ptr)
    if count == 0:
        tl.atomic_xchg(count_ptr, 1)
    else:
        dw += tl.load(partial_dw_ptr, mask=mask)
        db += tl.load(partial_db_ptr, mask=mask)
    tl.store(partial_dw_ptr, dw, mask=mask)
    tl.store(partial_db_ptr, db, mask=mask)
    tl.debug_barrier()
    tl.atomic_xchg(lock_ptr, 0)


@triton.jit
def layer_norm_bwd_dwdb(partial_dw_ptr, partial_db_ptr, grad_w_ptr, grad_b_ptr, M, N,
                        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Sums the M partial rows of dw and db, BLOCK_SIZE_N columns per program."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    dw = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    db = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for i in range(0, M, BLOCK_SIZE_M):
        rows = i + tl.arange(0, BLOCK_SIZE_M)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        offs = rows[:, None] * N + cols[None, :]
        dw += tl.load(partial_dw_ptr + offs, mask=mask, other=0.)
        db += tl.load(partial_db_ptr + offs, mask=mask, other=0.)
    tl.store(grad_w_ptr + cols, tl.sum(dw, axis=0), mask=cols < N)
    tl.store(grad_b_ptr + cols, tl.sum(db, axis=0), mask=cols < N)


@triton.jit
def layer_norm_bwd_dx_fused_broken_no_lock(grad_x_ptr, grad_y_ptr, partial_dw_ptr, partial_db_ptr, x_ptr, w_ptr, mean_ptr,
                                           rstd_ptr, lock_ptr, stride, N, GROUP_SIZE_M: tl.constexpr,
                                           BLOCK_SIZE_N: tl.constexpr):
    """The lock taken away: programs of one group load, add and store the shared row at once."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE_N)
    mask = cols < N
    x_ptr += row * stride
    grad_y_ptr += row * stride
    grad_x_ptr += row * stride
    group = row % GROUP_SIZE_M
    lock_ptr += group
    count_ptr = lock_ptr + GROUP_SIZE_M
    partial_dw_ptr += group * N + cols
    partial_db_ptr += group * N + cols
    x = tl.load(x_ptr + cols, mask=mask, other=0.).to(tl.float32)
    dy = tl.load(grad_y_ptr + cols, mask=mask, other=0.).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.)
    wdy = tl.where(mask, w * dy, 0.)
    c1 = tl.sum(xhat * wdy, axis=0) / N
    c2 = tl.sum(wdy, axis=0) / N
    dx = (wdy - (xhat * c1 + c2)) * rstd
    tl.store(grad_x_ptr + cols, dx, mask=mask)
    dw = (dy * xhat).to(w.dtype)
    db = dy.to(w.dtype)
    count = tl.atomic_xchg(count_ptr, 1)
    if count != 0:
        dw += tl.load(partial_dw_ptr, mask=mask)  # BUG: no lock around the read-modify-write of the shared row
        db += tl.load(partial_db_ptr, mask=mask)
    tl.store(partial_dw_ptr, dw, mask=mask)
    tl.store(partial_db_ptr, db, mask=mask)


@triton.jit
def layer_norm_bwd_dx_fused_broken_c2(grad_x_ptr, grad_y_ptr, partial_dw_ptr, partial_db_ptr, x_ptr, w_ptr, mean_ptr,
                                      rstd_ptr, lock_ptr, stride, N, GROUP_SIZE_M: tl.constexpr,
                                      BLOCK_SIZE_N: tl.constexpr):
    """grad_x without the mean of w * dy."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE_N)
    mask = cols < N
    x_ptr += row * stride
    grad_y_ptr += row * stride
    grad_x_ptr += row * stride
    group = row % GROUP_SIZE_M
    lock_ptr += group
    count_ptr = lock_ptr + GROUP_SIZE_M
    partial_dw_ptr += group * N + cols
    partial_db_ptr += group * N + cols
    x = tl.load(x_ptr + cols, mask=mask, other=0.).to(tl.float32)
    dy = tl.load(grad_y_ptr + cols, mask=mask, other=0.).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    mean = tl.load(mean_ptr + row)
    rstd = tl.load(rstd_ptr + row)
    xhat = tl.where(mask, (x - mean) * rstd, 0.)
    wdy = tl.where(mask, w * dy, 0.)
    c1 = tl.sum(xhat * wdy, axis=0) / N
    dx = (wdy - xhat * c1) * rstd  # BUG: the c2 = mean(w * dy) term is dropped
    tl.store(grad_x_ptr + cols, dx, mask=mask)
    dw = (dy * xhat).to(w.dtype)
    db = dy.to(w.dtype)
    while tl.atomic_cas(lock_ptr, 0, 1) == 1:
        pass
    count = tl.load(count_ptr)
    if count == 0:
        tl.atomic_xchg(count_ptr, 1)
    else:
        dw += tl.load(partial_dw_ptr, mask=mask)
        db += tl.load(partial_db_ptr, mask=mask)
    tl.store(partial_dw_ptr, dw, mask=mask)
    tl.store(partial_db_ptr, db, mask=mask)
    tl.debug_barrier()
    tl.atomic_xchg(lock_ptr, 0)

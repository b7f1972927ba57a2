"""Backward of layer_scale.py in one launch, dgamma finished by the last program to arrive (a
"last block" reduction, as kernels do to avoid a second launch):

    dx = dy * gamma
    dgamma = sum over rows of dy * x: each program adds its tile's column sums into a zeroed f32
    accumulator with `tl.atomic_add`, then takes a ticket from a counter (`tl.atomic_add`'s old
    value); every program but the last returns early, and the last reads the accumulator back
    with an atomic read (`tl.atomic_add(ptr, 0.0)`), writes dgamma and resets the counter with
    `tl.atomic_xchg`.

`_layer_scale_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _layer_scale_bwd(
    X,
    GAMMA,
    DY,
    DX,
    DGAMMA_ACC,
    COUNTER,
    DGAMMA,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0)
    dy = tl.load(DY + offsets, mask=mask, other=0.0)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    tl.store(DX + offsets, dy * gamma[None, :], mask=mask)

    tl.atomic_add(DGAMMA_ACC + cols, tl.sum(dy * x, axis=0), mask=col_mask)
    ticket = tl.atomic_add(COUNTER, 1)
    if ticket != tl.num_programs(0) - 1:
        return
    total = tl.atomic_add(DGAMMA_ACC + cols, 0.0, mask=col_mask)
    tl.store(DGAMMA + cols, total, mask=col_mask)
    # Leave the counter at zero for the next launch (callers cache it).
    tl.atomic_xchg(COUNTER, 0)


@triton.jit
def _layer_scale_bwd_broken_last(
    X,
    GAMMA,
    DY,
    DX,
    DGAMMA_ACC,
    COUNTER,
    DGAMMA,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0)
    dy = tl.load(DY + offsets, mask=mask, other=0.0)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    tl.store(DX + offsets, dy * gamma[None, :], mask=mask)

    tl.atomic_add(DGAMMA_ACC + cols, tl.sum(dy * x, axis=0), mask=col_mask)
    ticket = tl.atomic_add(COUNTER, 1)
    if ticket != tl.num_programs(0):  # BUG: off by one: no program holds the last ticket, so dgamma is never written
        return
    total = tl.atomic_add(DGAMMA_ACC + cols, 0.0, mask=col_mask)
    tl.store(DGAMMA + cols, total, mask=col_mask)
    # Leave the counter at zero for the next launch (callers cache it).
    tl.atomic_xchg(COUNTER, 0)


@triton.jit
def _layer_scale_bwd_broken_dx(
    X,
    GAMMA,
    DY,
    DX,
    DGAMMA_ACC,
    COUNTER,
    DGAMMA,
    M,
    N,
    stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows[:, None] < M) & col_mask[None, :]
    offsets = rows[:, None] * stride + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0)
    dy = tl.load(DY + offsets, mask=mask, other=0.0)
    gamma = tl.load(GAMMA + cols, mask=col_mask, other=0.0)
    tl.store(DX + offsets, dy * x, mask=mask)  # BUG: scales by x (as dgamma does), not by gamma

    tl.atomic_add(DGAMMA_ACC + cols, tl.sum(dy * x, axis=0), mask=col_mask)
    ticket = tl.atomic_add(COUNTER, 1)
    if ticket != tl.num_programs(0) - 1:
        return
    total = tl.atomic_add(DGAMMA_ACC + cols, 0.0, mask=col_mask)
    tl.store(DGAMMA + cols, total, mask=col_mask)
    # Leave the counter at zero for the next launch (callers cache it).
    tl.atomic_xchg(COUNTER, 0)

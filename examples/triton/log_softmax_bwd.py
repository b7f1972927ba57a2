"""Backward of log_softmax.py from the saved output y, in two passes over column blocks:

    dx = dy - exp(y) * sum(dy)

`_log_softmax_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
`_log_softmax_bwd_tail_without_other` sums its last block loaded without `other`: right on
Triton's NVIDIA and AMD backends, which read the masked-off lanes as 0 (a check notes the load,
since Triton documents those lanes as undefined).
"""
import triton
import triton.language as tl


@triton.jit
def _log_softmax_bwd(Y, DY, DX, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    Y += row * stride
    DY += row * stride
    DX += row * stride
    dy_sum = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        dy = tl.load(DY + cols, mask=cols < n_cols, other=0.0)
        dy_sum += tl.sum(tl.float32(dy), axis=0)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        y = tl.float32(tl.load(Y + cols, mask=mask, other=0.0))
        dy = tl.float32(tl.load(DY + cols, mask=mask, other=0.0))
        dx = dy - tl.exp(y) * dy_sum
        tl.store(DX + cols, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _log_softmax_bwd_broken_exp(Y, DY, DX, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    Y += row * stride
    DY += row * stride
    DX += row * stride
    dy_sum = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        dy = tl.load(DY + cols, mask=cols < n_cols, other=0.0)
        dy_sum += tl.sum(tl.float32(dy), axis=0)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        y = tl.float32(tl.load(Y + cols, mask=mask, other=0.0))
        dy = tl.float32(tl.load(DY + cols, mask=mask, other=0.0))
        dx = dy - y * dy_sum  # BUG: the softmax is exp(y), not the log-softmax y
        tl.store(DX + cols, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _log_softmax_bwd_tail_without_other(Y, DY, DX, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    Y += row * stride
    DY += row * stride
    DX += row * stride
    dy_sum = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        dy = tl.load(DY + cols, mask=cols < n_cols)  # no `other`: the masked-off lanes read 0 on the GPU
        dy_sum += tl.sum(tl.float32(dy), axis=0)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        y = tl.float32(tl.load(Y + cols, mask=mask, other=0.0))
        dy = tl.float32(tl.load(DY + cols, mask=mask, other=0.0))
        dx = dy - tl.exp(y) * dy_sum
        tl.store(DX + cols, dx.to(DX.dtype.element_ty), mask=mask)

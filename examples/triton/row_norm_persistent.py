"""Row L2 norms by a *persistent* kernel, as libraries write them to launch one program per SM:
each program walks the rows `pid, pid + NUM_PROGS, ...` (an outer loop) and each row's columns
in chunks (an inner loop). The backward walks them the same way.

    norm[r] = sqrt(sum over c of x[r, c]^2);  dx[r, c] = dnorm[r] * x[r, c] / norm[r]

`row_norm_persistent_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def row_norm_persistent_fwd(X, NORM, n_rows, n_cols, NUM_PROGS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for row in range(pid, n_rows, NUM_PROGS):
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for c0 in range(0, n_cols, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            x = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=0.0)
            acc += x * x
        tl.store(NORM + row, tl.sqrt(tl.sum(acc, axis=0)))


@triton.jit
def row_norm_persistent_bwd(X, NORM, DNORM, DX, n_rows, n_cols, NUM_PROGS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for row in range(pid, n_rows, NUM_PROGS):
        scale = tl.load(DNORM + row) / tl.load(NORM + row)
        for c0 in range(0, n_cols, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
            tl.store(DX + row * n_cols + cols, x * scale, mask=mask)


@triton.jit
def row_norm_persistent_bwd_broken_no_norm(X, NORM, DNORM, DX, n_rows, n_cols, NUM_PROGS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for row in range(pid, n_rows, NUM_PROGS):
        scale = tl.load(DNORM + row)  # BUG: not divided by the norm
        for c0 in range(0, n_cols, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
            tl.store(DX + row * n_cols + cols, x * scale, mask=mask)


@triton.jit
def row_norm_persistent_bwd_broken_first_chunk(X, NORM, DNORM, DX, n_rows, n_cols, NUM_PROGS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for row in range(pid, n_rows, NUM_PROGS):
        scale = tl.load(DNORM + row) / tl.load(NORM + row)
        for c0 in range(BLOCK, n_cols, BLOCK):  # BUG: each row's first chunk is skipped
            cols = c0 + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0)
            tl.store(DX + row * n_cols + cols, x * scale, mask=mask)

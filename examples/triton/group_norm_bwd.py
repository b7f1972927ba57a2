"""Backward of group_norm.py, one program per (sample, group), reading the saved mean and rstd
(xhat = (x - mean) * rstd, g = dy * w, means over the group's cpg * HW elements):

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dw[c] = sum over samples and HW of dy * xhat,  db[c] = sum of dy
    (one row of partial dw, db per sample, summed on the host)

`_group_norm_bwd_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def _group_norm_bwd(
    X,
    DY,
    DX,
    W,
    Mean,
    Rstd,
    DW_partial,
    DB_partial,
    stride_n,
    stride_c,
    C,
    HW,
    num_groups,
    BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr,
):
    n = tl.program_id(0)
    g = tl.program_id(1)
    cpg = C // num_groups
    c_local = tl.arange(0, BLOCK_C)
    ch = g * cpg + c_local
    hw = tl.arange(0, BLOCK_HW)
    c_mask = c_local < cpg
    mask = c_mask[:, None] & (hw[None, :] < HW)
    offsets = n * stride_n + ch[:, None] * stride_c + hw[None, :]

    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + ch, mask=c_mask, other=0.0).to(tl.float32)
    mean = tl.load(Mean + n * num_groups + g)
    rstd = tl.load(Rstd + n * num_groups + g)
    count = cpg * HW

    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    dyw = dy * w[:, None]
    c1 = tl.sum(tl.sum(dyw * xhat, axis=1), axis=0) / count
    c2 = tl.sum(tl.sum(dyw, axis=1), axis=0) / count
    dx = rstd * (dyw - c2 - xhat * c1)
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)

    dw = tl.sum(dy * xhat, axis=1)
    db = tl.sum(dy, axis=1)
    tl.store(DW_partial + n * C + ch, dw, mask=c_mask)
    tl.store(DB_partial + n * C + ch, db, mask=c_mask)


@triton.jit
def _group_norm_bwd_broken_count(
    X,
    DY,
    DX,
    W,
    Mean,
    Rstd,
    DW_partial,
    DB_partial,
    stride_n,
    stride_c,
    C,
    HW,
    num_groups,
    BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr,
):
    n = tl.program_id(0)
    g = tl.program_id(1)
    cpg = C // num_groups
    c_local = tl.arange(0, BLOCK_C)
    ch = g * cpg + c_local
    hw = tl.arange(0, BLOCK_HW)
    c_mask = c_local < cpg
    mask = c_mask[:, None] & (hw[None, :] < HW)
    offsets = n * stride_n + ch[:, None] * stride_c + hw[None, :]

    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + ch, mask=c_mask, other=0.0).to(tl.float32)
    mean = tl.load(Mean + n * num_groups + g)
    rstd = tl.load(Rstd + n * num_groups + g)
    count = cpg * HW

    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    dyw = dy * w[:, None]
    c1 = tl.sum(tl.sum(dyw * xhat, axis=1), axis=0) / count
    c2 = tl.sum(tl.sum(dyw, axis=1), axis=0) / HW  # BUG: the mean over one channel's HW elements, not over the group
    dx = rstd * (dyw - c2 - xhat * c1)
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)

    dw = tl.sum(dy * xhat, axis=1)
    db = tl.sum(dy, axis=1)
    tl.store(DW_partial + n * C + ch, dw, mask=c_mask)
    tl.store(DB_partial + n * C + ch, db, mask=c_mask)


@triton.jit
def _group_norm_bwd_broken_dw(
    X,
    DY,
    DX,
    W,
    Mean,
    Rstd,
    DW_partial,
    DB_partial,
    stride_n,
    stride_c,
    C,
    HW,
    num_groups,
    BLOCK_C: tl.constexpr,
    BLOCK_HW: tl.constexpr,
):
    n = tl.program_id(0)
    g = tl.program_id(1)
    cpg = C // num_groups
    c_local = tl.arange(0, BLOCK_C)
    ch = g * cpg + c_local
    hw = tl.arange(0, BLOCK_HW)
    c_mask = c_local < cpg
    mask = c_mask[:, None] & (hw[None, :] < HW)
    offsets = n * stride_n + ch[:, None] * stride_c + hw[None, :]

    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + ch, mask=c_mask, other=0.0).to(tl.float32)
    mean = tl.load(Mean + n * num_groups + g)
    rstd = tl.load(Rstd + n * num_groups + g)
    count = cpg * HW

    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    dyw = dy * w[:, None]
    c1 = tl.sum(tl.sum(dyw * xhat, axis=1), axis=0) / count
    c2 = tl.sum(tl.sum(dyw, axis=1), axis=0) / count
    dx = rstd * (dyw - c2 - xhat * c1)
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)

    dw = tl.sum(dy * (x - mean), axis=1)  # BUG: dw from the centred x, without rstd
    db = tl.sum(dy, axis=1)
    tl.store(DW_partial + n * C + ch, dw, mask=c_mask)
    tl.store(DB_partial + n * C + ch, db, mask=c_mask)

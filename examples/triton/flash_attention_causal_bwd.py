"""Backward of attn_fwd_causal (Out[h] = softmax(causal(Q[h] K[h]^T * sm_scale)) V[h]), one
program per BLOCK_M query rows of one head, from the saved output Out and the cotangent grad_o:

    Delta = rowsum(grad_o * Out); pass 1 over the key blocks up to the diagonal recomputes the
    row max and the softmax denominator as the forward does; pass 2 recomputes P and accumulates
    grad_q += (P * (grad_o V^T - Delta)) K * sm_scale in registers, while grad_k and grad_v,
    which every later query block contributes to, are accumulated with atomic_add into
    zero-initialized buffers.

grad_q, grad_k, grad_v and grad_o use the strides of q, k, v and Out. Each
`attn_bwd_causal_broken_*` differs from `attn_bwd_causal` in one line, marked with a comment
saying what is wrong.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def attn_bwd_causal(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                    stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd,
                    stride_vh, stride_vn, stride_vd, stride_oh, stride_om, stride_od,
                    N_CTX,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    q_ptr += head * stride_qh
    k_ptr += head * stride_kh
    v_ptr += head * stride_vh
    o_ptr += head * stride_oh
    grad_o_ptr += head * stride_oh
    grad_q_ptr += head * stride_qh
    grad_k_ptr += head * stride_kh
    grad_v_ptr += head * stride_vh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * LOG2E
    hi = (start_m + 1) * BLOCK_M
    # pass 1: the softmax's row max m_i and denominator l_i, in base 2, as the forward has them
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(tl.math.exp2(qk - m_new[:, None]), 1)
        m_i = m_new
    # pass 2: P, then dq in registers and dk, dv by atomic adds (every query block at or after a
    # key block contributes to it)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.atomic_add(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, dv, mask=kv_mask)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, dq, input_precision="ieee")
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq * sm_scale, mask=q_mask)


@triton.jit
def attn_bwd_causal_broken_mask(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                                stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd,
                                stride_vh, stride_vn, stride_vd, stride_oh, stride_om, stride_od,
                                N_CTX,
                                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    q_ptr += head * stride_qh
    k_ptr += head * stride_kh
    v_ptr += head * stride_vh
    o_ptr += head * stride_oh
    grad_o_ptr += head * stride_oh
    grad_q_ptr += head * stride_qh
    grad_k_ptr += head * stride_kh
    grad_v_ptr += head * stride_vh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * LOG2E
    hi = (start_m + 1) * BLOCK_M
    # pass 1: the softmax's row max m_i and denominator l_i, in base 2, as the forward has them
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(tl.math.exp2(qk - m_new[:, None]), 1)
        m_i = m_new
    # pass 2: P, then dq in registers and dk, dv by atomic adds (every query block at or after a
    # key block contributes to it)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = cur_n[None, :] < N_CTX  # BUG: the causal mask is left out: P spreads over later keys of the diagonal block
        qk = tl.where(visible, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.atomic_add(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, dv, mask=kv_mask)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, dq, input_precision="ieee")
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq * sm_scale, mask=q_mask)


@triton.jit
def attn_bwd_causal_broken_diagonal(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                                    stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd,
                                    stride_vh, stride_vn, stride_vd, stride_oh, stride_om, stride_od,
                                    N_CTX,
                                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    q_ptr += head * stride_qh
    k_ptr += head * stride_kh
    v_ptr += head * stride_vh
    o_ptr += head * stride_oh
    grad_o_ptr += head * stride_oh
    grad_q_ptr += head * stride_qh
    grad_k_ptr += head * stride_kh
    grad_v_ptr += head * stride_vh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * LOG2E
    hi = (start_m + 1) * BLOCK_M
    # pass 1: the softmax's row max m_i and denominator l_i, in base 2, as the forward has them
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(tl.math.exp2(qk - m_new[:, None]), 1)
        m_i = m_new
    # pass 2: P, then dq in registers and dk, dv by atomic adds (every query block at or after a
    # key block contributes to it)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, start_m * BLOCK_M, BLOCK_N):  # BUG: stops before the diagonal block: its keys get no gradient from it, nor dq from them
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.atomic_add(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, dv, mask=kv_mask)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, dq, input_precision="ieee")
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq * sm_scale, mask=q_mask)


@triton.jit
def attn_bwd_causal_broken_strict(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                                  stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd,
                                  stride_vh, stride_vn, stride_vd, stride_oh, stride_om, stride_od,
                                  N_CTX,
                                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    q_ptr += head * stride_qh
    k_ptr += head * stride_kh
    v_ptr += head * stride_vh
    o_ptr += head * stride_oh
    grad_o_ptr += head * stride_oh
    grad_q_ptr += head * stride_qh
    grad_k_ptr += head * stride_kh
    grad_v_ptr += head * stride_vh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * LOG2E
    hi = (start_m + 1) * BLOCK_M
    # pass 1: the softmax's row max m_i and denominator l_i, in base 2, as the forward has them
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(tl.math.exp2(qk - m_new[:, None]), 1)
        m_i = m_new
    # pass 2: P, then dq in registers and dk, dv by atomic adds (every query block at or after a
    # key block contributes to it)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] < offs_m[:, None]) & (cur_n[None, :] < N_CTX)  # BUG: `<` for `<=`: P of the diagonal (key i for query i) is masked out
        qk = tl.where(visible, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.atomic_add(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, dv, mask=kv_mask)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, dq, input_precision="ieee")
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq * sm_scale, mask=q_mask)


@triton.jit
def attn_bwd_causal_broken_no_delta(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                                    stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd,
                                    stride_vh, stride_vn, stride_vd, stride_oh, stride_om, stride_od,
                                    N_CTX,
                                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    head = tl.program_id(1)
    q_ptr += head * stride_qh
    k_ptr += head * stride_kh
    v_ptr += head * stride_vh
    o_ptr += head * stride_oh
    grad_o_ptr += head * stride_oh
    grad_q_ptr += head * stride_qh
    grad_k_ptr += head * stride_kh
    grad_v_ptr += head * stride_vh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * LOG2E
    hi = (start_m + 1) * BLOCK_M
    # pass 1: the softmax's row max m_i and denominator l_i, in base 2, as the forward has them
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(tl.math.exp2(qk - m_new[:, None]), 1)
        m_i = m_new
    # pass 2: P, then dq in registers and dk, dv by atomic adds (every query block at or after a
    # key block contributes to it)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.atomic_add(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, dv, mask=kv_mask)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * dp  # BUG: the softmax Jacobian needs p * (dp - delta), the row term is dropped
        dq = tl.dot(ds, k, dq, input_precision="ieee")
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq * sm_scale, mask=q_mask)

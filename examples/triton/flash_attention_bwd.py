"""Backward of attn_fwd (Out = softmax(Q K^T * sm_scale) V, one head), one program per BLOCK_M
query rows, from the saved output Out and the cotangent grad_o:

    Delta = rowsum(grad_o * Out); pass 1 over key blocks recomputes the row max and the softmax
    denominator as the forward does; pass 2 over key blocks recomputes P and accumulates
    grad_q += (P * (grad_o V^T - Delta)) K * sm_scale in registers, while grad_k and grad_v,
    which every query block contributes to, are accumulated with atomic_add into
    zero-initialized buffers.

grad_q, grad_k, grad_v and grad_o use the strides of q, k, v and Out. Each `attn_bwd_broken_*`
differs from `attn_bwd` in one line, marked with a comment saying what is wrong.
"""
import triton
import triton.language as tl


@triton.jit
def attn_bwd(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
             stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_om, stride_od,
             N_CTX,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * 1.44269504  # 1/ln(2): use exp2
    # pass 1: row max m_i and denominator l_i of the softmax, in base 2
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_ij) + tl.sum(tl.math.exp2(qk - m_ij[:, None]), 1)
        m_i = m_ij
    # pass 2: P, then the gradients
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
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
def attn_bwd_broken_sm_scale(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                             stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_om, stride_od,
                             N_CTX,
                             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * 1.44269504  # 1/ln(2): use exp2
    # pass 1: row max m_i and denominator l_i of the softmax, in base 2
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_ij) + tl.sum(tl.math.exp2(qk - m_ij[:, None]), 1)
        m_i = m_ij
    # pass 2: P, then the gradients
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.atomic_add(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, dv, mask=kv_mask)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, dq, input_precision="ieee")
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq, mask=q_mask)  # BUG: the sm_scale factor of grad_q is dropped


@triton.jit
def attn_bwd_broken_key_mask(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                             stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_om, stride_od,
                             N_CTX,
                             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * 1.44269504  # 1/ln(2): use exp2
    # pass 1: row max m_i and denominator l_i of the softmax, in base 2
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(offs_n[None, :] < N_CTX, qk, -float("inf"))  # BUG: tile-local key index in the mask, padded keys count in the softmax denominator
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_ij) + tl.sum(tl.math.exp2(qk - m_ij[:, None]), 1)
        m_i = m_ij
    # pass 2: P, then the gradients
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
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
def attn_bwd_broken_race(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                         stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_om, stride_od,
                         N_CTX,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * 1.44269504  # 1/ln(2): use exp2
    # pass 1: row max m_i and denominator l_i of the softmax, in base 2
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_ij) + tl.sum(tl.math.exp2(qk - m_ij[:, None]), 1)
        m_i = m_ij
    # pass 2: P, then the gradients
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.store(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, tl.load(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask) + dv, mask=kv_mask)  # BUG: load-add-store of grad_v, shared by all query blocks, not atomic
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, dq, input_precision="ieee")
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq * sm_scale, mask=q_mask)


@triton.jit
def attn_bwd_broken_dq_accumulate(q_ptr, k_ptr, v_ptr, o_ptr, grad_o_ptr, grad_q_ptr, grad_k_ptr, grad_v_ptr, sm_scale,
                                  stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd, stride_om, stride_od,
                                  N_CTX,
                                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    o = tl.load(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    do = tl.load(grad_o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=q_mask, other=0.0)
    delta = tl.sum(do * o, axis=1)
    qk_scale = sm_scale * 1.44269504  # 1/ln(2): use exp2
    # pass 1: row max m_i and denominator l_i of the softmax, in base 2
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        l_i = l_i * tl.math.exp2(m_i - m_ij) + tl.sum(tl.math.exp2(qk - m_ij[:, None]), 1)
        m_i = m_ij
    # pass 2: P, then the gradients
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_CTX, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        qk = tl.where(cur_n[None, :] < N_CTX, qk, -float("inf"))
        p = tl.math.exp2(qk - m_i[:, None]) / l_i[:, None]
        dv = tl.dot(tl.trans(p), do, input_precision="ieee")
        tl.atomic_add(grad_v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, dv, mask=kv_mask)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds, k, input_precision="ieee")  # BUG: accumulator not passed, only the last key block counts
        dk = tl.dot(tl.trans(ds), q, input_precision="ieee") * sm_scale
        tl.atomic_add(grad_k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, dk, mask=kv_mask)
    tl.store(grad_q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, dq * sm_scale, mask=q_mask)

"""Causal flash attention over a batch of heads, forward: for each head h,
Out[h] = softmax(causal(Q[h] K[h]^T * sm_scale)) V[h], where query row i attends to keys j <= i.

One program per BLOCK_M query rows of one head (grid: query blocks x heads). It streams over the
key blocks up to its diagonal, keeping a running row max, a running softmax denominator and the
unnormalized output, in base 2 (exp2 of scores scaled by 1/ln 2).
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def attn_fwd_causal(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale,
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
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_mask = offs_m[:, None] < N_CTX
    q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E
    # Keys up to the block's last query row: later ones are all masked.
    hi = (start_m + 1) * BLOCK_M
    for start_n in range(0, hi, BLOCK_N):
        cur_n = start_n + offs_n
        kv_mask = cur_n[:, None] < N_CTX
        k = tl.load(k_ptr + cur_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cur_n[None, :] <= offs_m[:, None]) & (cur_n[None, :] < N_CTX)
        qk = tl.where(visible, qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + cur_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, out, mask=q_mask)

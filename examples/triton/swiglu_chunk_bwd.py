"""Backward of swiglu_chunk.py: the gradients of the two halves go to two new tensors, which the
launcher concatenates into the gradient of `gate_up` (`torch.cat([dgate, dup], -1)`).

    dgate = dh * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))
    dup   = dh * silu(gate)

`swiglu_bwd_kernel_broken_*` differ from the correct kernel in one line, marked `# BUG:`.
"""
import triton
import triton.language as tl


@triton.jit
def swiglu_bwd_kernel(dh_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    dh = tl.load(dh_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    dgate = dh * up * sig * (1.0 + gate * (1.0 - sig))
    tl.store(dgate_ptr + row * stride + offsets, dgate, mask=mask)
    tl.store(dup_ptr + row * stride + offsets, dh * silu, mask=mask)


@triton.jit
def swiglu_bwd_kernel_broken_sigmoid(dh_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    dh = tl.load(dh_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    dgate = dh * up * sig * (1.0 - sig)  # BUG: the derivative of sigmoid, not of silu
    tl.store(dgate_ptr + row * stride + offsets, dgate, mask=mask)
    tl.store(dup_ptr + row * stride + offsets, dh * silu, mask=mask)

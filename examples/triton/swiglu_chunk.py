"""SwiGLU on the two halves of a fused gate/up projection, as MLP launchers compute it: the
launcher splits `gate_up` with `gate, up = gate_up.chunk(2, -1)` and runs one row per program:

    h = silu(gate) * up = gate * sigmoid(gate) * up
"""
import triton
import triton.language as tl


@triton.jit
def swiglu_fwd_kernel(gate_ptr, up_ptr, h_ptr, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    gate = tl.load(gate_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * stride + offsets, mask=mask, other=0.0).to(tl.float32)
    h = gate * tl.sigmoid(gate) * up
    tl.store(h_ptr + row * stride + offsets, h, mask=mask)

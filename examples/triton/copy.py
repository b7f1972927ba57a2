import triton
import triton.language as tl


@triton.jit
def copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """dst[i] = src[i]"""
    start = tl.program_id(0) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(src_ptr + offs, mask=mask, other=0.0)
    tl.store(dst_ptr + offs, v, mask=mask)

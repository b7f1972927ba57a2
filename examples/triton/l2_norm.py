import triton
import triton.language as tl


@triton.jit
def l2_norm_partial(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x * x))


@triton.jit
def l2_norm_finish(partial_ptr, out_ptr, num_partials, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in tl.range(0, tl.cdiv(num_partials, BLOCK)):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + offs, mask=offs < num_partials, other=0.0)
    tl.store(out_ptr, tl.sqrt(tl.sum(acc, axis=0)))

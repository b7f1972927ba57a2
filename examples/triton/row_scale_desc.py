import triton
import triton.language as tl


@triton.jit
def row_scale_fwd(x_desc, w_ptr, b_ptr, y_desc, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = tanh(x * w[None, :]) + b[None, :] over a 2-D grid of tiles, reading and writing through
    tensor descriptors built on the host (`TensorDescriptor.from_tensor(x, [BLOCK_M, BLOCK_N])`),
    with the pre-3.9 `_experimental_descriptor_load/store` API the Hopper tutorials use."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    x = tl._experimental_descriptor_load(x_desc, [m0, n0], [BLOCK_M, BLOCK_N], tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.)
    b = tl.load(b_ptr + cols, mask=cols < N, other=0.)
    y = tl.math.tanh(x * w[None, :]) + b[None, :]
    tl._experimental_descriptor_store(y_desc, y, [m0, n0])

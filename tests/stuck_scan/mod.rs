//! A backward whose `while` loop never moves on (its `start -= BLOCK` is missing), as the
//! fuzzer made it from the cumsum example: checked on the CPU by `tests/robust.rs`, on the GPU
//! by `tests/gpu.rs`. Its `while` is at `k.py:19:5`.

/// A row-wise cumulative sum and its backward, a reversed scan of column blocks in a `while`
/// loop whose `start -= BLOCK` is missing: the loop never moves on, storing every trip.
pub const KERNELS: &str = r#"import triton
import triton.language as tl

@triton.jit
def scan(X, Y, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    carry = 0.0
    for start in tl.range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * stride + offs, mask=offs < n_cols, other=0.0)
        tl.store(Y + row * stride + offs, tl.cumsum(x, axis=0) + carry, mask=offs < n_cols)
        carry += tl.sum(x, axis=0)

@triton.jit
def scan_bwd_stuck(DY, DX, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start = ((n_cols + BLOCK - 1) // BLOCK - 1) * BLOCK
    carry = 0.0
    while start >= 0:
        offs = start + tl.arange(0, BLOCK)
        dy = tl.load(DY + row * stride + offs, mask=offs < n_cols, other=0.0)
        tl.store(DX + row * stride + offs, tl.cumsum(dy, axis=0, reverse=True) + carry, mask=offs < n_cols)
        carry += tl.sum(dy, axis=0)
"#;

pub const SPEC: &str = r#"
[kernels]
fwd = "k.py::scan"
bwd = "k.py::scan_bwd_stuck"

[inputs]
x = { shape = [7, 250], init = "normal" }

[forward]
outputs = ["y"]
steps = [
  { alloc = "y", like = "x" },
  { launch = "fwd", grid = [7], args = { X = "x", Y = "y", stride = "x.stride(0)", n_cols = 250, BLOCK = 32 } },
]

[backward]
gradients = { x = "grad_x" }
steps = [
  { alloc = "grad_x", like = "x" },
  { launch = "bwd", grid = [7], args = { DY = "grad_y", DX = "grad_x", stride = "x.stride(0)", n_cols = 250, BLOCK = 32 } },
]
"#;

"""Row-wise log-softmax in the style of fused-softmax kernels, for rows longer than a block: a
first pass over column blocks keeps an online max and sum of exponentials, a second writes
y = x - max - log(sum). Statistics in f32 (`tl.float32(x)`), y in the output's dtype.
"""
import triton
import triton.language as tl


@triton.jit
def _log_softmax_fwd(X, Y, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride
    Y += row * stride
    m = float("-inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        x = tl.float32(tl.load(X + cols, mask=cols < n_cols, other=float("-inf")))
        m_new = max(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.float32(tl.load(X + cols, mask=mask, other=0.0))
        tl.store(Y + cols, (x - lse).to(Y.dtype.element_ty), mask=mask)

"""Cross entropy with label smoothing and a z-loss, in the style of fused LM-head losses: one row
of logits per program, an online logsumexp over column blocks (Python's `max` on tensors), the
float constexprs `label_smoothing` and `lse_square_scale` (the z-loss weight, folded away at 0.0)
and the bool constexpr `HAS_SMOOTHING`; labels are integer indices.

    lse = logsumexp(x[r, :]),  eps = label_smoothing
    loss[r] = lse - (1 - eps) x[r, y[r]] - eps / n_cols * sum_j x[r, j] + lse_square_scale * lse^2
"""
import triton
import triton.language as tl


@triton.jit
def _smooth_ce_fwd(
    X,
    X_stride,
    Y,
    LOSS,
    LSE,
    n_cols,
    label_smoothing: tl.constexpr = 0.0,
    lse_square_scale: tl.constexpr = 0.0,
    HAS_SMOOTHING: tl.constexpr = False,
    BLOCK_SIZE: tl.constexpr = 1024,
):
    row = tl.program_id(0).to(tl.int64)
    X += row * X_stride
    label = tl.load(Y + row)
    m = float("-inf")
    d = 0.0
    sum_x = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(X + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m_new = max(m, tl.max(x, axis=0))
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
        if HAS_SMOOTHING:
            sum_x += tl.sum(tl.where(mask, x, 0.0), axis=0)
    lse = m + tl.log(d)
    x_label = tl.load(X + label).to(tl.float32)
    if HAS_SMOOTHING:
        loss = lse - (1.0 - label_smoothing) * x_label - label_smoothing / n_cols * sum_x
    else:
        loss = lse - x_label
    if lse_square_scale != 0.0:
        loss += lse_square_scale * lse * lse
    tl.store(LOSS + row, loss)
    tl.store(LSE + row, lse)

"""A cumulative sum along each row in chunks, as chunked-recurrence kernels write it: each chunk
adds the running total, read back from the previous chunk's last output with a *conditional
expression*, `tl.load(...) if c > 0 else 0.`. Python and Triton evaluate only the side the
condition picks; the first chunk's load (at offset -1 for row 0) never runs.

    y[r, t] = sum over s <= t of x[r, s];  dx[r, t] = sum over s >= t of dy[r, s]
"""
import triton
import triton.language as tl


@triton.jit
def chunk_cumsum_fwd(X, Y, T, BT: tl.constexpr):
    row = tl.program_id(0)
    for c in range(0, tl.cdiv(T, BT)):
        offs = c * BT + tl.arange(0, BT)
        m = offs < T
        x = tl.load(X + row * T + offs, mask=m, other=0.)
        prev = tl.load(Y + row * T + c * BT - 1) if c > 0 else 0.
        tl.store(Y + row * T + offs, tl.cumsum(x, axis=0) + prev, mask=m)

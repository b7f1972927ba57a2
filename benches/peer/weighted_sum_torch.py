# The peer of `cargo bench --bench ad -- --only weighted_sum`: the weighted-sum kernel emulated
# with PyTorch as triton_bwd does it (every program instance's loads are gathers through offset
# tensors, batched over the grid; stores are scatters; the gradient comes from autograd), f32 on
# the CPU, 2 threads, no bounds checks. Run: python3 benches/peer/weighted_sum_torch.py
import sys, time, torch
torch.set_num_threads(2)
def grad(rows, d, rt=16, dt=128):
    x = torch.randn(rows * d, requires_grad=True); w = torch.randn(d, requires_grad=True)
    g = torch.randn(rows)
    P = (rows + rt - 1) // rt
    pid = torch.arange(P)
    r = pid[:, None] * rt + torch.arange(rt)[None, :]            # [P, rt]
    acc = torch.zeros(P, rt)
    for t in range((d + dt - 1) // dt):
        c = t * dt + torch.arange(dt)                                # [dt]
        m = (r[:, :, None] < rows) & (c[None, None, :] < d)          # [P, rt, dt]
        off = (r[:, :, None] * d + c[None, None, :]).clamp(0, rows * d - 1)
        xt = torch.where(m, x[off], torch.zeros(()))
        wt = torch.where(c < d, w[c.clamp(0, d - 1)], torch.zeros(()))
        acc = acc + (xt * wt[None, None, :]).sum(-1)
    out = torch.zeros(rows).index_put((r.clamp(0, rows - 1).reshape(-1),), acc.reshape(-1) * (r < rows).reshape(-1))
    (out * g).sum().backward()
    return x.grad, w.grad
for rows, d in [(4096, 512), (65536, 1024)]:
    grad(rows, d)
    ts = []
    for _ in range(5 if rows < 10000 else 2):
        t = time.perf_counter(); grad(rows, d); ts.append(time.perf_counter() - t)
    ts.sort(); print(f"peer emulation weighted sum {rows}x{d}: {ts[len(ts)//2]*1e3:.1f} ms")

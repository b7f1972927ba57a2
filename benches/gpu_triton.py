"""Triton's own times for the kernels of `benches/gpu.rs`, as JSON milliseconds.

    python benches/gpu_triton.py OUT.json

Needs a GPU, PyTorch and Triton. Same kernels (`examples/triton/`), sizes and block sizes as the
Rust bench; `triton.testing.do_bench` (median of its repetitions, after warm-up). `<name>_bwd`:
the hand-written backward kernels of `examples/` at the same sizes (kernel time; the weighted
sum's host sum of its per-program partial grad_w not included), for `--grad`.
"""
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "triton"))
from matmul import matmul  # noqa: E402
from matmul_bwd import matmul_bwd_da, matmul_bwd_db  # noqa: E402
from softmax_bwd import softmax_bwd  # noqa: E402
from weighted_sum_bwd import weighted_sum_bwd  # noqa: E402
from softmax import softmax  # noqa: E402
from weighted_sum import weighted_sum_fwd  # noqa: E402
from flash_attention_causal import attn_fwd_causal  # noqa: E402
from flash_attention_causal_bwd import attn_bwd_causal  # noqa: E402
from cross_entropy_fused import cross_entropy_fwd_grad_kernel  # noqa: E402


def main(out):
    dev = "cuda"
    times = {}
    rows, d = 65536, 1024
    x = torch.rand(rows, d, device=dev) * 2 - 1
    w = torch.rand(d, device=dev) * 2 - 1
    o = torch.empty(rows, device=dev)
    times["weighted_sum"] = triton.testing.do_bench(
        lambda: weighted_sum_fwd[(rows // 16,)](x, w, o, x.stride(0), x.stride(1), w.stride(0), o.stride(0), rows, d,
                                                ROWS_TILE_SIZE=16, D_TILE_SIZE=64))
    go = torch.rand(rows, device=dev) * 2 - 1
    gx = torch.empty_like(x)
    pgw = torch.empty(rows // 16, d, device=dev)
    times["weighted_sum_bwd"] = triton.testing.do_bench(
        lambda: weighted_sum_bwd[(rows // 16,)](x, w, go, gx, pgw, x.stride(0), x.stride(1), w.stride(0), go.stride(0),
                                                gx.stride(0), gx.stride(1), pgw.stride(0), pgw.stride(1), rows, d,
                                                ROWS_TILE_SIZE=16, D_TILE_SIZE=64))
    n = 2048
    a = torch.rand(n, n, device=dev) * 2 - 1
    b = torch.rand(n, n, device=dev) * 2 - 1
    c = torch.empty(n, n, device=dev)
    times["matmul"] = triton.testing.do_bench(
        lambda: matmul[(n // 64, n // 64)](a, b, c, n, n, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                           c.stride(0), c.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32))
    gc = torch.rand(n, n, device=dev) * 2 - 1
    ga, gb = torch.empty_like(a), torch.empty_like(b)

    def matmul_bwd():
        matmul_bwd_da[(n // 64, n // 32)](b, gc, ga, n, n, n, b.stride(0), b.stride(1), gc.stride(0), gc.stride(1),
                                         ga.stride(0), ga.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
        matmul_bwd_db[(n // 32, n // 64)](a, gc, gb, n, n, n, a.stride(0), a.stride(1), gc.stride(0), gc.stride(1),
                                         gb.stride(0), gb.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    times["matmul_bwd"] = triton.testing.do_bench(matmul_bwd)
    sr, sc = 16384, 4096
    xs = torch.rand(sr, sc, device=dev) * 2 - 1
    ys = torch.empty_like(xs)
    times["softmax"] = triton.testing.do_bench(
        lambda: softmax[(sr,)](xs, ys, xs.stride(0), ys.stride(0), sr, sc, BLOCK_ROWS=1, BLOCK_COLS=sc))
    gy = torch.rand_like(xs) * 2 - 1
    gxs = torch.empty_like(xs)
    times["softmax_bwd"] = triton.testing.do_bench(
        lambda: softmax_bwd[(sr,)](ys, gy, gxs, ys.stride(0), gy.stride(0), gxs.stride(0), sr, sc,
                                   BLOCK_ROWS=1, BLOCK_COLS=sc))
    # Causal attention, 16 heads of T=8192, D=64 (as `examples/flash_attention_causal.toml` at
    # that size): the example's forward and its hand-written backward (atomics into grad_k, grad_v).
    heads, t, dh, bm, bn = 16, 8192, 64, 32, 16
    q, k, v = (torch.randn(heads, t, dh, device=dev) for _ in range(3))
    o = torch.empty_like(q)
    grid = (triton.cdiv(t, bm), heads)

    def strides(*ts):
        return [s for x in ts for s in x.stride()]
    times["attention"] = triton.testing.do_bench(
        lambda: attn_fwd_causal[grid](q, k, v, o, dh ** -0.5, *strides(q, k, v, o), t, HEAD_DIM=dh, BLOCK_M=bm, BLOCK_N=bn))
    go = torch.randn_like(o)
    gq, gk, gv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)

    def attn_bwd():
        gk.zero_()
        gv.zero_()
        attn_bwd_causal[grid](q, k, v, o, go, gq, gk, gv, dh ** -0.5, *strides(q, k, v, o), t, HEAD_DIM=dh, BLOCK_M=bm, BLOCK_N=bn)
    times["attention_bwd"] = triton.testing.do_bench(attn_bwd)
    # The fused cross entropy: 4096 rows of 32000 logits in 4096-wide tiles, the gradient stored
    # by the forward (no backward of its own to time: it only scales that gradient).
    rows, cols = 4096, 32000
    x = torch.rand(rows, cols, device=dev) * 2 - 1
    dx = torch.empty_like(x)
    labels = torch.randint(0, cols, (rows,), device=dev)
    loss = torch.empty(rows, device=dev)
    times["cross_entropy"] = triton.testing.do_bench(
        lambda: cross_entropy_fwd_grad_kernel[(rows,)](x, x.stride(0), dx, dx.stride(0), labels, loss, cols, rows, -100,
                                                       BLOCK_SIZE=4096))
    times["device"] = torch.cuda.get_device_name()
    with open(out, "w") as f:
        json.dump(times, f)
    print(json.dumps(times))


if __name__ == "__main__":
    main(sys.argv[1])

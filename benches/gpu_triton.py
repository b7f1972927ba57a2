"""Triton's own times for the kernels of `benches/gpu.rs`, as JSON milliseconds.

    python benches/gpu_triton.py OUT.json

Needs a GPU, PyTorch and Triton. Same kernels (`examples/triton/`), sizes and block sizes as the
Rust bench; `triton.testing.do_bench` (median of its repetitions, after warm-up).
"""
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "triton"))
from matmul import matmul  # noqa: E402
from softmax import softmax  # noqa: E402
from weighted_sum import weighted_sum_fwd  # noqa: E402


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
    n = 2048
    a = torch.rand(n, n, device=dev) * 2 - 1
    b = torch.rand(n, n, device=dev) * 2 - 1
    c = torch.empty(n, n, device=dev)
    times["matmul"] = triton.testing.do_bench(
        lambda: matmul[(n // 64, n // 64)](a, b, c, n, n, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                           c.stride(0), c.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32))
    sr, sc = 16384, 4096
    xs = torch.rand(sr, sc, device=dev) * 2 - 1
    ys = torch.empty_like(xs)
    times["softmax"] = triton.testing.do_bench(
        lambda: softmax[(sr,)](xs, ys, xs.stride(0), ys.stride(0), sr, sc, BLOCK_ROWS=1, BLOCK_COLS=sc))
    times["device"] = torch.cuda.get_device_name()
    with open(out, "w") as f:
        json.dump(times, f)
    print(json.dumps(times))


if __name__ == "__main__":
    main(sys.argv[1])

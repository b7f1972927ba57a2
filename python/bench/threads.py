"""A check's time with torch's intra-op threads left to torch (`--torch-threads`) and with the
one thread a check runs torch with (the default), at N elements (default 65536):

    python python/bench/threads.py [N] [--torch-threads]

Run it with the other cores busy (`python -c 'while True: pass' &`, one per other core): torch's
OpenMP threads, spinning between the check's small host ops, then take the cores from the engine.
"""

import contextlib
import pathlib
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import kernels as K  # noqa: E402
import tilegrad  # noqa: E402

if "--torch-threads" in sys.argv:
    tilegrad.one_torch_thread = contextlib.nullcontext
args = [a for a in sys.argv[1:] if not a.startswith("--")]
n = int(args[0]) if args else 65536


def square(x):
    y = torch.empty_like(x)
    K.square[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def square_bwd(x, gy):
    gx = torch.empty_like(x)
    K.square_bwd[(triton.cdiv(x.numel(), 1024),)](x, gy, gx, x.numel(), BLOCK=1024)
    return (gx,)


x = torch.randn(n)
tilegrad.check_backward(square, square_bwd, [x])  # warm the kernel cache
times = []
for _ in range(15):
    t = time.perf_counter()
    assert tilegrad.check_backward(square, square_bwd, [x]).passed
    times.append(time.perf_counter() - t)
how = f"torch's {torch.get_num_threads()} threads" if "--torch-threads" in sys.argv else "one torch thread"
print(f"{n} elements, {how}: median {statistics.median(times):.4f} s (min {min(times):.4f}, max {max(times):.4f})")

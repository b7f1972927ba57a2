"""The Python overhead of `tilegrad.check_backward` over the engine's own time.

Runs the weighted sum's check (examples/triton/weighted_sum*.py through the test launcher) at
4096x512 and 65536x1024 and splits the wall time into the time spent inside the engine's calls
(launches, VJPs, comparisons) and the rest (interception, binding, torch host code, copies):

    target/pyenv/bin/python python/bench/overhead.py
"""

import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import tilegrad  # noqa: E402
from tilegrad import _native  # noqa: E402
from launchers import make  # noqa: E402

engine = [0.0]


def timed(f):
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            engine[0] += time.perf_counter() - t

    return g


for name in ("launch", "vjp", "compare", "make_report"):
    setattr(_native, name, timed(getattr(_native, name)))

fn = make("weighted_sum")
for rows, d in ((4096, 512), (65536, 1024)):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=gen)
    w = torch.rand(d, generator=gen) * 2 - 1
    tilegrad.check_function(fn, x[:64], w)  # warm the kernel cache
    engine[0] = 0.0
    t = time.perf_counter()
    r = tilegrad.check_function(fn, x, w)
    total = time.perf_counter() - t
    assert r.passed, str(r)
    e = engine[0]
    print(f"weighted sum {rows}x{d}: check_backward {total:.3f} s, engine {e:.3f} s, Python overhead {total - e:.3f} s ({100 * (total - e) / e:.1f}% of the engine)")

"""The whole-check time of `tilegrad.check_function` on CUDA tensors, beside the Function's own
forward + backward on the GPU and (with `--cpu`) the same check on CPU tensors.

    python python/bench/cuda_check.py [--sizes 4096x4096,16384x4096] [--cpu] [--profile] [--liger] [--compiles]

For each library-style Function (python/tests/functions_liger_style.py's RMS norm; with
`--liger`, Liger-Kernel's RMSNorm, LayerNorm, SwiGLU and cross entropy Functions where the
package imports; `--only NAME` keeps those whose name contains NAME)
and size: the Function's own forward + backward (median of 10, CUDA events), the first check
(kernels converted and compiled: quick forms, see `Gpu::quick_first`), how long the optimised
forms went on compiling in the background after it, and the second, which runs them, with
`backend="gpu"`, 2 trials, and how far
the process's resident memory rose above where it started during the second (sampled every
millisecond from /proc/self/statm), beside the bytes of one gradient tensor. `--profile`
prints where the second check's time goes (cProfile, by own time); `--compiles`, the first
check's NVRTC compiles (what, how long, how long launches waited) and its profile.
"""

from __future__ import annotations

import argparse
import cProfile
import pathlib
import pstats
import os
import sys
import threading
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import tilegrad  # noqa: E402


def functions(liger: bool):
    import functions_liger_style as L

    out = [("rms_norm (library style)", L.RMSNorm, lambda x: (x, _weight(x)))]
    if liger:
        try:
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction
            from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
        except ImportError as e:
            print(f"Liger-Kernel skipped: {e}")
        else:
            out += [
                ("Liger RMSNorm", LigerRMSNormFunction, lambda x: (x, _weight(x), 1e-6)),
                ("Liger LayerNorm", LigerLayerNormFunction, lambda x: (x, _weight(x), _weight(x) - 1.0, 1e-6)),
                ("Liger SiLUMul", LigerSiLUMulFunction, lambda x: (x, torch.randn_like(x))),
                # Overwrites its logits with their gradient in place; columns are the vocabulary.
                ("Liger CrossEntropy", LigerCrossEntropyFunction, lambda x: (x, _labels(x), None)),
            ]
    return out


def _weight(x: torch.Tensor) -> torch.Tensor:
    return torch.rand(x.shape[-1], device=x.device, dtype=x.dtype) + 0.5


def _labels(x: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator(device=x.device).manual_seed(1)
    return torch.randint(0, x.shape[-1], (x.shape[0],), device=x.device, generator=gen)


def native_seconds(fn, args) -> float:
    """Median of 10: the Function's forward and backward, with CUDA events (on copies of the
    inputs: a Function may overwrite them)."""
    ins = [a.detach().clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args]
    times = []
    for _ in range(11):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn.apply(*ins)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out))
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times[1:])[5]


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssPeak:
    """The most the resident memory rose above its level at `__enter__`, sampled every ms."""

    def __enter__(self):
        self.base = self.peak = _resident_bytes()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.done.wait(0.001):
            self.peak = max(self.peak, _resident_bytes())

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, _resident_bytes())
        self.rise = self.peak - self.base


def timed_check(fn, args, backend: str) -> tuple[float, object, int]:
    torch.cuda.synchronize()
    with RssPeak() as rss:
        t = time.perf_counter()
        r = tilegrad.check_function(fn, *args, backend=backend, trials=2)
        torch.cuda.synchronize()
        took = time.perf_counter() - t
    return took, r, rss.rise


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096x4096,16384x4096")
    ap.add_argument("--cpu", action="store_true", help="also the check on CPU tensors")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--liger", action="store_true")
    ap.add_argument("--only", default="", help="only Functions whose name contains this")
    ap.add_argument("--compiles", action="store_true", help="the first check's NVRTC compiles and its profile")
    a = ap.parse_args()
    gpu = tilegrad._native.Executor("gpu")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| Function | size | own fwd+bwd | check gpu, first | compiling after it | second | ratio to own | host RSS rise, second / one gradient | check cpu | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, fn, make in (f for f in functions(a.liger) if a.only in f[0]):
        for size in a.sizes.split(","):
            rows, cols = (int(v) for v in size.split("x"))
            gen = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(rows, cols, device="cuda", generator=gen)
            args = make(x)
            own = native_seconds(fn, args)
            before = len(gpu.compiles())
            first_profile = cProfile.Profile() if a.compiles else None
            if first_profile:
                first_profile.enable()
            first, _, _ = timed_check(fn, args, "gpu")
            if first_profile:
                first_profile.disable()
            # The optimised forms still compiling in the background, which later calls run.
            t = time.perf_counter()
            tilegrad._native.wait_for_compiles()
            after = time.perf_counter() - t
            second, r, rise = timed_check(fn, args, "gpu")
            grad = x.numel() * x.element_size()
            cpu = ""
            if a.cpu:
                host = [v.cpu() if isinstance(v, torch.Tensor) else v for v in args]
                t = time.perf_counter()
                tilegrad.check_function(fn, *host, backend="cpu", trials=2)
                cpu = f"{time.perf_counter() - t:.2f} s"
            verdict = "PASS" if r.passed else "FAIL"
            mib = 1 << 20
            print(
                f"| {name} | {size} | {own * 1e3:.2f} ms | {first:.2f} s | {after:.2f} s | {second:.2f} s | {second / own:.0f}x "
                f"| {rise / mib:.0f} / {grad / mib:.0f} MiB | {cpu} | {verdict} |"
            )
            if first_profile:
                print(f"first check's compiles (seconds NVRTC took, seconds launches waited), {name} {size}:")
                for what, took, waited in gpu.compiles()[before:]:
                    print(f"    {took:6.2f} {waited:6.2f}  {what}")
                pstats.Stats(first_profile).sort_stats("cumulative").print_stats(25)
            if a.profile:
                p = cProfile.Profile()
                p.enable()
                timed_check(fn, args, "gpu")
                p.disable()
                pstats.Stats(p).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()

"""`backend="triton"`: the user's launches run on Triton itself, the code that ships.

Each launch of the forward in the kernels' dtypes and of the backward under test runs twice on
the same memory: first on tilegrad's own GPU backend (its reading of the kernel, with the notes
and the backward's first error in program order that only it gives), then, from the same
contents, on Triton, whose results stay. The ground truth is tilegrad's (the VJP of its reading),
so where the two runs differ beyond rounding the check is about another program than the one
that ships: each such launch is a finding about the semantics (`Report.triton_differences`),
reported as such, not a verdict on the backward (`strict=True` makes it a failure). A failing
backward's blame runs its launches again on tilegrad's backend, as without this option.

"Beyond rounding": an element differs where one value is NaN and the other is not, where one is
infinite and the other differs, or where `|triton - tilegrad| > rtol * (|tilegrad| + rms)`, with
`rms` the root mean square of tilegrad's finite values in that tensor and `rtol` 2^-10 for f32
and f64 (Triton contracts `a * b + c`, approximates `exp`, sums in its own order: about 2^-20 on
the examples) and 2^-5 for f16 and bf16 (a few units of their last place where the order of
rounding differs). What these miss is what a reading that differs changes: lanes, branches,
broadcasts, whole values.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import _native
from ._intercept import LaunchCall

_RTOL = {"f16": 2.0**-5, "bf16": 2.0**-5, "f32": 2.0**-10, "f64": 2.0**-10}


def require_cuda(inputs: list[Any]) -> None:
    """`backend="triton"` runs the launches on the GPU where the tensors are: every tensor input
    must be a CUDA tensor."""
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.device.type != "cuda":
            raise _native.UsageError(
                f'backend="triton" runs the launches on Triton itself, on the GPU: input {i} is a {x.device.type} tensor '
                '(pass CUDA tensors, or use backend="gpu" or "cpu")'
            )


def run_both(call: LaunchCall, ours: Callable[[], Any], where: str, differences: list[dict]) -> Any:
    """Runs `call` with `ours` (tilegrad's run in place, returning its record), then on Triton from
    the same memory, keeping Triton's results; appends to `differences` what differs beyond
    rounding (`where`: "forward step 2"). Returns `ours`' record."""
    if call.on_triton is None:
        raise _native.UsageError(f"{call.describe()} was not launched through Triton's `kernel[grid](...)`: it cannot run on Triton")
    written = sorted(call.written)
    flats = [call.storages.items[i].device_flat for i in written]
    if any(f is None for f in flats):
        raise _native.UsageError(f'backend="triton": {call.describe()} writes a tensor that is not on the GPU')
    with torch.no_grad():
        before = [f.clone() for f in flats]
        rec = ours()
        mine = [f.clone() for f in flats]
        for f, b in zip(flats, before):
            f.copy_(b)
        call.on_triton()
        if flats and flats[0].is_cuda:
            torch.cuda.synchronize()
        for i, f, m in zip(written, flats, mine):
            s = call.storages.items[i]
            d = differ(f, m, s.dtype)
            if d is not None:
                d.update(launch=call.describe(), where=where, tensor="/".join(dict.fromkeys(s.names)))
                differences.append(d)
    return rec


def differ(triton: torch.Tensor, ours: torch.Tensor, dtype: str) -> dict | None:
    """How Triton's results of one tensor differ from tilegrad's beyond rounding (see the module
    docs): elements over, of how many, and the first such element with both values; None where
    none does (or the tensor is not a float one)."""
    if not triton.is_floating_point():
        same = triton == ours
        if bool(same.all()):
            return None
        return _first(~same, triton, ours, "bits")
    a, b = triton.double(), ours.double()
    fin = torch.isfinite(b)
    rms = float(b[fin].square().mean().sqrt()) if bool(fin.any()) else 0.0
    rtol = _RTOL.get(dtype, 2.0**-10)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    # Where either is infinite, only equal values agree; elsewhere the rounding rule.
    inf = (torch.isinf(a) | torch.isinf(b)) & (a != b)
    far = (a - b).abs() > rtol * (b.abs() + rms)
    bad = (nan_a != nan_b) | (~nan_a & ~nan_b & (inf | far))
    if not bool(bad.any()):
        return None
    return _first(bad, triton, ours, f"rtol {rtol:g} of |tilegrad| + rms {rms:.3g}")


def _first(bad: torch.Tensor, triton: torch.Tensor, ours: torch.Tensor, rule: str) -> dict:
    at = int(bad.nonzero()[0, 0])
    return {
        "elements": int(bad.sum()),
        "of": bad.numel(),
        "element": at,
        "triton": float(triton[at]),
        "tilegrad": float(ours[at]),
        "rule": rule,
    }


def describe(d: dict) -> str:
    """One line of the report for a difference."""
    return (
        f"{d['where']}, {d['launch']}: `{d['tensor']}` differs at {d['elements']} of {d['of']} elements beyond rounding "
        f"({d['rule']}); first at flat element {d['element']}: Triton {d['triton']!r}, tilegrad {d['tilegrad']!r}"
    )

"""`check_backward` and `vjp` on numpy arrays, without torch.

Without torch there is no autograd to carry cotangents through host code, so the ground truth is
a tape of the forward's kernel launches: each launch's storages are snapshotted before it runs
(promoted to f64), and the reverse sweep applies the engine's VJP launch by launch, with one
cotangent per storage, as the CLI's ground truth does. Host numpy code between launches is not
differentiated: an output that no launch wrote is an error, and the gradient of an input reaches
only the kernels that read its own memory.

While the backward under test runs, `numpy.empty` and `numpy.empty_like` fill float arrays with
NaN, as the CLI's `empty` allocations start.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Sequence

import numpy as np

from . import _native
from ._intercept import LaunchCall, current_executor, intercepting
from ._memory import dtype_name, storage_of
from ._configs import each_config
from ._report import Report, non_finite

_COT_SEED_MIX = 0x9E3779B97F4A7C15


def _flat(owner: np.ndarray, numel: int, dtype: np.dtype) -> np.ndarray:
    if not owner.flags.c_contiguous:
        raise _native.UsageError("a kernel argument views a non-contiguous numpy buffer, which tilegrad cannot address")
    return owner.reshape(-1).view(dtype)[:numel]


def _indices(a: np.ndarray) -> tuple[tuple, np.ndarray]:
    """(storage key, flat storage index of every element of `a`, row-major)."""
    key, _, _, offset, _ = storage_of(a)
    es = a.dtype.itemsize
    idx = np.full(a.shape, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(a.shape, a.strides)):
        shape = [1] * a.ndim
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * (s // es)).reshape(shape)
    return key, idx.reshape(-1)


class _Tape:
    """The ground truth's launches, with their storages as they were before each ran."""

    def __init__(self, native: bool) -> None:
        self.native = native
        self.promoted = not native  # its launches run on f64 copies of the inputs
        self.entries: list[tuple[LaunchCall, list[np.ndarray]]] = []
        self.keep: list[Any] = []
        # Where the VJPs run (`ground="kernels"`), as where the launches ran.
        self.executor = current_executor()

    def __call__(self, call: LaunchCall) -> None:
        before = []
        for s in call.storages.items:
            flat = _flat(s.flat, s.numel, np.dtype(s.flat.dtype))
            before.append(flat.astype(np.float64) if flat.dtype.kind == "f" and not self.native else flat.copy())
            self.keep.append(s.flat)
        call.run(promote=not self.native)
        self.entries.append((call, before))

    def written(self) -> set[tuple]:
        return {call.storages.items[i].key for call, _ in self.entries for i in call.written}

    def reverse(self, cot: dict[tuple, np.ndarray]) -> dict[tuple, np.ndarray]:
        for call, before in reversed(self.entries):
            floats = [i for i, b in enumerate(before) if b.dtype.kind == "f"]
            outs = [(i, np.ascontiguousarray(cot[call.storages.items[i].key], dtype=np.float64)) for i in floats if call.storages.items[i].key in cot]
            if not outs:
                continue
            grads = {i: np.zeros(before[i].size, dtype=np.float64) for i in floats}
            specs = [("/".join(dict.fromkeys(s.names)), dtype_name(b), b.__array_interface__["data"][0], s.numel) for s, b in zip(call.storages.items, before)]
            _native.vjp(
                call.kernel,
                call.grid,
                call.ptr_args,
                call.scalars,
                specs,
                [(i, g.__array_interface__["data"][0]) for i, g in grads.items()],
                [(i, c.__array_interface__["data"][0]) for i, c in outs],
                native=self.native,
                executor=self.executor,
            )
            for i, g in grads.items():
                cot[call.storages.items[i].key] = g
        return cot


def _ground_truth(fn: Callable, inputs: list[Any], native: bool) -> tuple[tuple, _Tape, list[Any]]:
    ins = [x.astype(np.float64) if not native and _is_float(x) else (np.array(x, copy=True) if isinstance(x, np.ndarray) else x) for x in inputs]
    tape = _Tape(native)
    with intercepting(tape):
        outs = _as_tuple(fn(*ins))
    return outs, tape, ins


def _grads(outs: tuple, cots: Sequence[Any], tape: _Tape, ins: list[Any]) -> list[Any]:
    written = tape.written()
    cot: dict[tuple, np.ndarray] = {}
    for o, c in zip(outs, cots):
        if c is None or not _is_float(o):
            continue
        key, idx = _indices(o)
        if key not in written:
            raise _native.UsageError("an output of the forward was not written by any kernel launch: without torch, tilegrad differentiates kernel launches only")
        s = cot.setdefault(key, np.zeros(_numel_of(o), dtype=np.float64))
        np.add.at(s, idx, np.asarray(c, dtype=np.float64).reshape(-1))
    cot = tape.reverse(cot)
    out = []
    for x in ins:
        if not _is_float(x):
            out.append(None)
            continue
        key, idx = _indices(x)
        c = cot.get(key)
        out.append(np.zeros(x.shape) if c is None else c[idx].reshape(x.shape))
    return out


def _numel_of(a: np.ndarray) -> int:
    return storage_of(a)[2]


def vjp(fn: Callable, inputs: list[Any], cotangents: Any, *, precision: str = "f64") -> list[Any]:
    outs, tape, ins = _ground_truth(fn, inputs, precision == "native")
    return _grads(outs, _as_tuple(cotangents), tape, ins)


def _is_float(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


@contextlib.contextmanager
def _nan_empty():
    real_empty, real_like = np.empty, np.empty_like

    def empty(*a, **k):
        out = real_empty(*a, **k)
        if out.dtype.kind == "f":
            out.fill(np.nan)
        return out

    def empty_like(*a, **k):
        out = real_like(*a, **k)
        if out.dtype.kind == "f":
            out.fill(np.nan)
        return out

    np.empty, np.empty_like = empty, empty_like
    try:
        yield
    finally:
        np.empty, np.empty_like = real_empty, real_like


def check_backward(forward, backward, inputs, *, seed, trials, precision, rtol, atol, name, allow_non_finite=False, autotune=0, strict=False) -> Report:
    return each_config(
        autotune,
        name or getattr(forward, "__name__", "check"),
        lambda n: _check(
            forward, backward, inputs, seed=seed, trials=trials, precision=precision, rtol=rtol, atol=atol, name=n, allow_non_finite=allow_non_finite, strict=strict
        ),
    )


def _finite(a: Any, what: str, why: str) -> None:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        return
    bad = ~np.isfinite(a)
    if bad.any():
        first = int(np.flatnonzero(bad.reshape(-1))[0])
        raise non_finite(what, float(a.reshape(-1)[first]), [int(i) for i in np.unravel_index(first, a.shape)], why)


def _check(forward, backward, inputs, *, seed, trials, precision, rtol, atol, name, allow_non_finite, strict) -> Report:
    if trials < 1:
        raise ValueError("at least one cotangent trial is needed")
    native = precision == "native"
    inputs = list(inputs)
    diff = [i for i, x in enumerate(inputs) if _is_float(x)]
    if not diff:
        raise ValueError("no differentiable input: pass at least one float array")
    try:
        names = [p.name for p in inspect.signature(forward).parameters.values()]
    except (TypeError, ValueError):
        names = []
    names = [names[i] if i < len(names) else f"input{i}" for i in range(len(inputs))]
    if not allow_non_finite:
        for i in diff:
            _finite(inputs[i], f"input `{names[i]}`", "it was given so")
    notes: list[Any] = []
    fwd_steps = [0]

    def run_fwd(call: LaunchCall) -> None:
        notes.extend(call.run(notes=("forward", fwd_steps[0])).notes())
        fwd_steps[0] += 1

    with intercepting(run_fwd):
        outs_n = _as_tuple(forward(*[np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in inputs]))
    outs_t, tape, ins_t = _ground_truth(forward, inputs, native)
    out_idx = [i for i, o in enumerate(outs_n) if _is_float(o)]
    out_names = ["out"] if len(outs_n) == 1 else [f"out{i}" for i in range(len(outs_n))]
    fwd_cmp = []
    for i in out_idx:
        if not allow_non_finite:
            _finite(outs_t[i], f"the ground truth's forward output `{out_names[i]}`", "the forward is not finite on these inputs")
        e, g = _f64(outs_t[i]), _f64(outs_n[i])
        fwd_cmp.append(_native.compare(out_names[i], out_names[i], dtype_name(outs_n[i]), list(outs_n[i].shape), _ptr(e), _ptr(g), 0, rtol, atol, False))
    rng = np.random.default_rng((seed ^ _COT_SEED_MIX) & 0x7FFFFFFFFFFFFFFF)
    calib = None  # the ground truth in the kernels' dtypes, for calibrated tolerances
    calib_trial: list[Any] = [-1, None]
    best: dict[int, Any] = {}
    failure = None
    for trial in range(trials):
        cots = [rng.standard_normal(o.shape).astype(o.dtype) if i in out_idx else None for i, o in enumerate(outs_n)]
        truth = _grads(outs_t, cots, tape, ins_t)
        if not allow_non_finite:
            for i in diff:
                _finite(truth[i], f"the ground-truth gradient of `{names[i]}` (trial {trial})", "the forward is not differentiable to a finite value on these inputs")
        records: list[tuple[int, LaunchCall, Any]] = []

        def run_bwd(call: LaunchCall, noting: bool = trial == 0) -> None:
            rec = call.run(record=True, notes=("backward", len(records)) if noting else None)
            if noting:
                notes.extend(rec.notes())
            records.append((len(records), call, rec))

        try:
            with _nan_empty(), intercepting(run_bwd):
                grads = _as_tuple(backward(*[np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in inputs], *[c for c in cots if c is not None]))
        except _native.LaunchError as e:
            failure = (len(records), "launch", str(e), trial)
            break
        for i in diff:
            x, g = inputs[i], grads[i] if i < len(grads) else None
            gname = f"grad_{names[i]}"
            if g is None:
                g, gname = np.zeros_like(x), "None"
            g = np.asarray(g)
            if g.shape != x.shape:
                failure = (len(records), "gradients", f"gradient of `{names[i]}` has shape {g.shape}, the input has {x.shape}", trial)
                break
            e = _f64(truth[i])
            got = _f64(g)
            noisy = None
            # Calibrated where the elementwise defaults are loose (f16 gradients), as the CLI does.
            if rtol is None and atol is None and not native and dtype_name(g) in ("f16", "bf16"):
                if calib is None:
                    calib = _ground_truth(forward, inputs, True)
                if calib_trial[0] != trial:
                    calib_trial[:] = [trial, _grads(calib[0], cots, calib[1], calib[2])]
                noisy = _f64(calib_trial[1][i])
            c = _native.compare(
                names[i], gname, dtype_name(g), list(x.shape), _ptr(e), _ptr(got), trial, rtol, atol, False,
                None if noisy is None else _ptr(noisy),
            )
            if i not in best or c.badness > best[i].badness:
                if c.worst_index is not None and not c.passed:
                    key, idx = _indices(g)
                    elem = int(idx[c.worst_index])
                    for step, call, rec in reversed(records):
                        hit = next((rec.site(m, elem, step) for m, s in enumerate(call.storages.items) if s.key == key), None)
                        if hit is not None:
                            c.set_blame([], [hit])
                            break
                best[i] = c
        if failure is not None:
            break
    rep = _native.make_report(
        name or getattr(forward, "__name__", "check"),
        seed,
        trials,
        precision,
        fwd_cmp,
        [best[i] for i in diff if i in best],
        failure,
        current_executor(),
        notes,
        strict,
    )
    return Report(rep)


def _f64(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a), dtype=np.float64)


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]

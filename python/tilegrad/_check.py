"""`check_backward` and `check_function` on torch tensors.

A check runs the user's code three ways:

1. the forward in the kernels' own dtypes (what the backward will see), launches run in place;
2. the forward as the ground truth: inputs promoted to f64 (host code's float dtypes too), each
   launch a `torch.autograd.Function` whose backward is the engine's f64 VJP of the launch, so that
   torch autograd carries the cotangents through the host code between launches;
3. per trial, the backward under test on a random cotangent, its launches run as Triton's GPU
   backends run them (masked-off lanes of loads without `other` read 0; a note names the loads a
   launch's results depend on, since Triton documents those lanes as undefined), its
   `torch.empty*` allocations starting as NaN, and who wrote every element recorded for blame.

Gradients are compared with the CLI's tolerances and the report is the CLI's: the worst element of
a failing gradient is explained by running the backward once more, recorded (`_blame`), through
the user's host code to the kernel lines it was computed through.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Sequence

import torch

from . import _native
from ._intercept import LaunchCall, _handler, _is_descriptor, current_executor, intercepting, runs_on_triton
from ._modes import PoisonEmpty, PromoteFloats
from ._configs import each_config
from ._functions import GradientError, apply_under_test, checking, conform, inlining, refuse_opaque, requiring_grad
from ._report import Report, non_finite
from ._triton_backend import require_cuda, run_both
from . import _blame as _blame_mod

_COT_SEED_MIX = 0x9E3779B97F4A7C15


class _Launch(torch.autograd.Function):
    """A launch as a differentiable function of its storages' contents (ground truth)."""

    _tilegrad_internal = True

    @staticmethod
    def forward(ctx, call: LaunchCall, native: bool, notes: list[Any], *flats):  # type: ignore[override]
        executor = current_executor()
        in_place = call.storages.in_place(executor, promote=not native)
        # The initial contents, kept (the caller overwrites `flats` with the results): on the
        # device where the GPU backend runs the launch there, else host copies.
        initial = [f.detach().clone() if in_place else f.detach().to("cpu", copy=True) for f in flats]
        work = [t.clone() if i in call.written else t for i, t in enumerate(initial)]
        specs = [("/".join(dict.fromkeys(s.names)), s.dtype, w.data_ptr(), s.numel) for s, w in zip(call.storages.items, work)]
        if in_place:
            torch.cuda.synchronize()
            _native.launch(call.kernel, call.grid, call.ptr_args, call.scalars, specs, promote=not native, executor=executor, device=True)
        else:
            _native.launch(call.kernel, call.grid, call.ptr_args, call.scalars, specs, promote=not native)
        # The initial contents are kept as copies: the caller overwrites `flats` with the results.
        ctx.call, ctx.native, ctx.initial, ctx.devices, ctx.in_place = call, native, initial, [f.device for f in flats], in_place
        ctx.notes = notes
        # The backward may run on autograd's own threads: the executor is the forward's.
        ctx.executor = current_executor()
        outs = tuple(work[i].to(flats[i].device) for i in sorted(call.written))
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return outs

    @staticmethod
    def backward(ctx, *gouts):  # type: ignore[override]
        call: LaunchCall = ctx.call
        # Where the forward ran in place, the VJP takes device buffers too: a VJP kernel runs on
        # them in place; the evaluator's host copies are the engine's.
        where = ctx.initial[0].device if ctx.in_place else torch.device("cpu")
        flats = [f.to(where) for f in ctx.initial]
        written = sorted(call.written)
        outputs = []
        keep = []
        for i, g in zip(written, gouts):
            if g is not None and flats[i].is_floating_point():
                g = g.detach().to(where, torch.float64).contiguous()
                keep.append(g)
                outputs.append((i, g.data_ptr()))
        grads: list[torch.Tensor | None] = [None] * len(flats)
        if not outputs:
            return (None, None, None, *grads)
        inputs = []
        for i, f in enumerate(flats):
            if f.is_floating_point():
                grads[i] = torch.zeros(f.numel(), dtype=torch.float64, device=where)
                inputs.append((i, grads[i].data_ptr()))
        specs = [("/".join(dict.fromkeys(s.names)), s.dtype, f.data_ptr(), s.numel) for s, f in zip(call.storages.items, flats)]
        if ctx.in_place:
            torch.cuda.synchronize()
        note = _native.vjp(
            call.kernel,
            call.grid,
            call.ptr_args,
            call.scalars,
            specs,
            inputs,
            outputs,
            native=ctx.native,
            executor=ctx.executor,
            device=ctx.in_place,
            what=call.describe(),
        )
        # A refused VJP kernel (the evaluator gave the truth): noted once, not once per trial.
        if note is not None and all(str(n) != str(note) for n in ctx.notes):
            ctx.notes.append(note)
        out = [None if g is None else g.to(f.dtype).to(d) for g, f, d in zip(grads, flats, ctx.devices)]
        return (None, None, None, *out)


def _truth_launch(native: bool, notes: list[Any]) -> Callable[[LaunchCall], None]:
    def run(call: LaunchCall) -> None:
        # Flat views over each storage, as views of the caller's tensors (autograd-aware).
        flats = []
        for s in call.storages.items:
            t = next(v for n, v in call.args.items() if n in s.names)
            t = t.base if _is_descriptor(t) else t
            flats.append(torch.as_strided(t, (s.numel,), (1,), 0))
        if not torch.is_grad_enabled() or not any(f.requires_grad for f in flats):
            call.run(promote=not native)
            return
        outs = _Launch.apply(call, native, notes, *flats)
        with torch.enable_grad():
            for i, o in zip(sorted(call.written), outs):
                flats[i].copy_(o)

    run.promoted = not native  # type: ignore[attr-defined]
    return run


class _Backward:
    """The backward under test: its launches run on the exact path (the first error in program
    order is the one reported, as in the CLI), noted where `notes` is a list, and with who wrote
    every element recorded where `record` (for blame: a passing check records nothing)."""

    def __init__(self, notes: list[Any] | None = None, record: bool = False, triton: list[dict] | None = None) -> None:
        self.records: list[tuple[int, LaunchCall, Any]] = []
        self.failure: tuple[int, str, str] | None = None
        self.notes = notes
        self.record = record
        # `backend="triton"`: where each launch, run on tilegrad's backend first, differs on Triton.
        self.triton = triton

    def __call__(self, call: LaunchCall) -> None:
        step = len(self.records)

        def ours() -> Any:
            return call.run(record=self.record, exact=True, notes=None if self.notes is None else ("backward", step))

        try:
            rec = ours() if self.triton is None else run_both(call, ours, f"backward step {step}", self.triton)
        except _native.LaunchError as e:
            self.failure = (step, call.describe(), str(e))
            raise _Stop() from e
        if self.notes is not None:
            self.notes.extend(rec.notes())
        self.records.append((step, call, rec))


class _Stop(Exception):
    """The backward failed inside a launch; the check stops with a verdict."""


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _f64_cpu(t: torch.Tensor) -> torch.Tensor:
    """`t` as a contiguous f64 host tensor: a CUDA tensor is converted on its device, then copied
    into page-locked memory (torch's caching host allocator hands the same blocks back to the
    next comparison: no page faults, and the copy at the link's speed)."""
    t = t.detach()
    if t.is_cuda:
        host = torch.empty(t.shape, dtype=torch.float64, pin_memory=True)
        host.copy_(t.to(torch.float64))
        return host
    return t.to(torch.float64).contiguous()


def _compared_on_device(*ts: torch.Tensor | None) -> bool:
    """Whether a comparison of `ts` runs on the device: launches go to the GPU and every tensor
    given is a CUDA tensor (only the comparison's figures then come to the host)."""
    ex = current_executor()
    return ex is not None and ex.on_gpu and all(t is None or t.is_cuda for t in ts)


def _f64_for(t: torch.Tensor, device: bool) -> torch.Tensor:
    """`t` as contiguous f64 where the comparison reads it: on its device, else on the host."""
    return t.detach().to(torch.float64).contiguous() if device else _f64_cpu(t)


def _device_kw(device: bool) -> dict[str, Any]:
    return {"device": True, "executor": current_executor()} if device else {}


def _clone(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _blame(c: Any, worst: int, values: tuple[float, float], again: Callable[[], Any], recorded: Callable[[], tuple | None]) -> None:
    """Attaches to comparison `c` who computed element `worst` (row-major) of a gradient: the
    backward is run again recorded (`again()`: the gradient as it returns it), and the element
    followed through host ops to the launches that wrote what it came from (the CLI's blame and
    data flow). Where that run cannot be followed, the writers of the element itself in a run
    with only the launches' writers recorded (`recorded()`: the run and the gradient)."""
    e = _blame_mod.explain(again, worst, values)
    if e is not None:
        c.attach(e.blames, e.via, e.sites)
        return
    run = recorded()
    if run is None:
        return
    bwd, poison, g = run
    idx = _native.unravel(worst, list(g.shape))
    elem = g.storage_offset() + sum(i * s for i, s in zip(idx, g.stride()))
    key = ("torch", str(g.device), g.untyped_storage().data_ptr())
    for step, call, rec in reversed(bwd.records):
        for m, s in enumerate(call.storages.items):
            site = rec.site(m, elem, step) if s.key == key else None
            if site is not None:
                c.set_blame([], [site])
                return
    if key in poison.allocations:
        desc, _ = poison.allocations[key]
        c.set_blame([], [_native.Site.never_written(f"grad ({desc})", list(idx), 1, "NaN")])


@checking()
def run_check(
    name: str,
    input_names: Sequence[str],
    inputs: Sequence[Any],
    forward: Callable[[list[Any]], tuple],
    backward: Callable[[list[Any], list[torch.Tensor]], Sequence[Any]],
    *,
    seed: int,
    trials: int,
    precision: str,
    rtol: float | None,
    atol: float | None,
    allow_non_finite: bool = False,
    strict: bool = False,
    diff: list[int],
    explicit: bool,
    who: str,
    nondiff_outputs: Callable[[tuple], set[int]] | None = None,
    cotangents: Sequence[Any] | None = None,
) -> Report:
    """Checks `backward` against the ground truth of `forward` on `inputs`, differentiating the
    inputs `diff` (`explicit`: the caller asked for them, so a None gradient is a zero one, as
    torch takes it; otherwise a None gradient means the input is not differentiable and is not
    compared). `who` names the backward in torch's messages; `nondiff_outputs(outs)`: outputs
    that get no cotangent (marked non-differentiable). `cotangents`: the first trial's
    cotangents, one per output (`given_cotangents`), instead of random ones. The `apply` calls
    the check makes are its own (`checking`): `watch` leaves them alone."""
    if trials < 1:
        raise ValueError("at least one cotangent trial is needed")
    if precision not in ("f64", "native"):
        raise ValueError(f"precision must be 'f64' or 'native', not {precision!r}")
    native = precision == "native"
    if not allow_non_finite:
        for i in diff:
            _finite(inputs[i], f"input `{input_names[i]}`", "it was given so")
    tf32 = [False]
    notes: list[Any] = []
    fwd_steps = [0]
    # `backend="triton"`: each launch also runs on Triton, whose results stay (`_triton_backend`).
    triton: list[dict] | None = [] if runs_on_triton() else None
    if triton is not None:
        require_cuda(list(inputs))

    def run_native(call: LaunchCall) -> None:
        step = fwd_steps[0]

        def ours() -> Any:
            return call.run(notes=("forward", step))

        rec = ours() if triton is None else run_both(call, ours, f"forward step {step}", triton)
        notes.extend(rec.notes())
        fwd_steps[0] += 1
        tf32[0] |= call.kernel.uses_tf32()

    # 1. The forward in the kernels' dtypes, as training runs it (differentiated inputs require grad).
    with torch.enable_grad(), intercepting(run_native):
        outs_n = _as_tuple(forward(requiring_grad([_clone(x) for x in inputs], diff)))
    skip_out = nondiff_outputs(outs_n) if nondiff_outputs is not None else set()
    outs_n = tuple(_clone(o) for o in outs_n)
    out_idx = [i for i, o in enumerate(outs_n) if isinstance(o, torch.Tensor) and o.is_floating_point() and i not in skip_out]
    if not out_idx:
        raise ValueError("the forward returned no float tensor")

    # 2. The ground truth's forward.
    truth_f = _Truth(forward, inputs, diff, native, notes)
    outs_t = truth_f.outs
    if len(outs_t) != len(outs_n):
        raise ValueError(f"the forward returned {len(outs_n)} values, then {len(outs_t)}")

    out_names = ["out"] if len(outs_n) == 1 else [f"out{i}" for i in range(len(outs_n))]
    forward_cmp = []
    for i, o in enumerate(outs_n):
        if not (isinstance(o, torch.Tensor) and o.is_floating_point()):
            continue
        if not allow_non_finite:
            _finite(outs_t[i], f"the ground truth's forward output `{out_names[i]}`", "the forward is not finite on these inputs")
        dev = _compared_on_device(outs_t[i], o)
        exp, got = _f64_for(outs_t[i], dev), _f64_for(o, dev)  # kept alive while the engine reads them
        c = _native.compare(out_names[i], out_names[i], _dt(o), list(o.shape), *_ptrs(exp, got), 0, rtol, atol, tf32[0], **_device_kw(dev))
        forward_cmp.append(c)

    calibrate = rtol is None and atol is None and not native
    # The ground truth in the kernels' own dtypes (their rounding noise), for calibrated
    # tolerances: its forward runs on first use, its gradients once per trial.
    noise: _Truth | None = None
    noise_grads: tuple[int, dict[int, torch.Tensor]] = (-1, {})
    best: dict[int, Any] = {}
    blame: dict[int, tuple] = {}  # what explaining each gradient's worst element needs
    failure = None
    given = None if cotangents is None else given_cotangents(cotangents, outs_n, out_idx, out_names)
    for trial in range(trials):
        if trial == 0 and given is not None:
            cots_n = given
        else:
            cots_n = [_cotangent(o, seed, trial, i) if i in out_idx else None for i, o in enumerate(outs_n)]
        # Ground truth for this cotangent.
        truth = truth_f.grads(cots_n, out_idx)
        if not allow_non_finite:
            for i, g in truth.items():
                _finite(g, f"the ground-truth gradient of `{input_names[i]}` (trial {trial})", "the forward is not differentiable to a finite value on these inputs")
        # The backward under test.
        bwd = _Backward(notes if trial == 0 else None, triton=triton)
        poison = PoisonEmpty()
        grads = None
        try:
            with torch.no_grad(), intercepting(bwd), poison:
                grads = _as_tuple(backward([_clone(x) for x in inputs], [_clone(c) for c in cots_n]))
        except _Stop:
            step, what, message = bwd.failure
            failure = (step, what, message, trial)
            break
        except GradientError as e:
            failure = (len(bwd.records), "gradients", str(e), trial)
            break
        tf32b = any(call.kernel.uses_tf32() for _, call, _ in bwd.records)
        # The backward replayed with every float in f64 (the formula verdict).
        replay = None if native else _replay(backward, inputs, diff, cots_n)
        cot_rms = _rms([c for c in cots_n if c is not None])
        if len(grads) < len(inputs):
            failure = (len(bwd.records), "gradients", f"the backward returned {len(grads)} values for {len(inputs)} inputs", trial)
            break
        for i in diff:
            x, g = inputs[i], grads[i]
            gname = f"grad_{input_names[i]}"
            if g is None and not explicit:
                continue  # not differentiable by the backward's word, as torch takes a None
            if g is None:
                g = torch.zeros_like(x)
                gname = "None"
            conformed = _conformer(x, sum(isinstance(a, torch.Tensor) for a in inputs[:i]), who)
            try:
                g = conformed(g)
            except GradientError as e:
                failure = (len(bwd.records), "gradients", str(e), trial)
                break
            if not isinstance(g, torch.Tensor):
                failure = (len(bwd.records), "gradients", f"gradient of `{input_names[i]}` is a {type(g).__name__}, not a tensor", trial)
                break
            noisy = None
            # Where gradients compute in f16/bf16 or through a tf32 `dot`: the ground truth in the
            # kernels' dtypes, the error a computation of the same quantity in those dtypes has
            # (the rounding verdict's cancellation term; the calibrated tolerance without a replay).
            if (calibrate or replay is not None) and (_dt(g) in ("f16", "bf16") or (_dt(g) == "f32" and (tf32b or tf32[0]))):
                if noise is None:
                    noise = _Truth(forward, inputs, diff, True, notes)
                if noise_grads[0] != trial:
                    noise_grads = (trial, noise.grads(cots_n, out_idx))
                noisy = noise_grads[1].get(i, torch.zeros(x.shape, dtype=torch.float64, device=x.device))
            r64 = _replayed(replay, i, x)
            exp = truth.get(i, torch.zeros(x.shape, dtype=torch.float64, device=x.device))
            # On the device where every tensor compared is there (the calibrated tolerance
            # without a replay compares on the host).
            dev = _compared_on_device(exp, g, noisy, r64) and (r64 is not None or noisy is None)
            exp, got = _f64_for(exp, dev), _f64_for(g, dev)
            noisy = None if noisy is None else _f64_for(noisy, dev)
            r64 = None if r64 is None else _f64_for(r64, dev)
            c = _native.compare(
                input_names[i], gname, _dt(g), list(x.shape), *_ptrs(exp, got), trial, rtol, atol, tf32b or tf32[0],
                None if noisy is None else noisy.data_ptr(), None if r64 is None else r64.data_ptr(), cot_rms,
                replay_f32_storage=replay is not None and replay[1], **_device_kw(dev),
            )
            if i not in best or c.badness > best[i].badness:
                blame.pop(i, None)
                if c.worst_index is not None and not c.passed and grads[i] is not None:
                    w = c.worst_index
                    values = (float(exp.reshape(-1)[w]), float(got.reshape(-1)[w]))
                    blame[i] = (c, w, values, _rerun(backward, inputs, cots_n, i), _rerun_recorded(backward, inputs, cots_n, i, conformed))
                best[i] = c
        if failure is not None:
            break
    for args in blame.values():
        _blame(*args)
    grads_cmp = [best[i] for i in diff if i in best]
    # Inputs the backward gave None in every trial: not differentiable by its word.
    skipped = [] if failure is not None else [(input_names[i], list(inputs[i].shape), _dt(inputs[i]), "no gradient (None)") for i in diff if i not in best]
    rep = _native.make_report(name, seed, trials, precision, forward_cmp, grads_cmp, failure, current_executor(), notes, strict, skipped)
    return Report(rep, triton=triton, strict=strict)


def given_cotangents(cots: Sequence[Any], outs: tuple, out_idx: list[int], names: list[str]) -> list[Any]:
    """The cotangents a caller gives for the outputs `outs` (a tensor for a single output, else
    one entry per output), as the backward gets them: one per differentiable float output (an
    output given None gets zeros, as torch materializes a missing gradient), None for the others.
    Each keeps its layout (strides), in the output's dtype and on its device. ValueError where
    the count or a shape does not match the outputs."""
    cots = [cots] if isinstance(cots, torch.Tensor) else list(cots)
    if len(cots) != len(outs):
        raise ValueError(f"cotangents: {len(cots)} given for {len(outs)} outputs of the forward")
    picked: list[Any] = []
    for i, (o, c) in enumerate(zip(outs, cots)):
        if i not in out_idx:
            picked.append(None)
        elif c is None:
            picked.append(torch.zeros_like(o))
        elif not isinstance(c, torch.Tensor):
            raise ValueError(f"cotangents: the one of output `{names[i]}` is a {type(c).__name__}, not a tensor")
        elif c.shape != o.shape:
            raise ValueError(f"cotangents: the one of output `{names[i]}` has shape {list(c.shape)}, the output {list(o.shape)}")
        else:
            picked.append(c.detach() if (c.dtype, c.device) == (o.dtype, o.device) else c.detach().to(o.device, o.dtype))
    return picked


def _cotangent(o: torch.Tensor, seed: int, trial: int, i: int) -> torch.Tensor:
    """A standard normal cotangent for output `i` of trial `trial`, keyed by the seed alone, in
    the output's dtype and on its device: drawn by the engine, on the device where launches run
    on the GPU (the same values as on the host)."""
    key = ((seed ^ _COT_SEED_MIX) * 0x100000001B3 + trial * 0x9E3779B1 + i) & 0xFFFFFFFFFFFFFFFF
    if _compared_on_device(o):
        wide = torch.float32 if o.dtype == torch.float32 else torch.float64
        c = torch.empty(o.shape, dtype=wide, device=o.device)
        _native.standard_normal(c.data_ptr(), c.numel(), key, f32=wide == torch.float32, device=True, executor=current_executor())
        return c.to(o.dtype)
    c = torch.empty(o.shape, dtype=torch.float64, pin_memory=o.is_cuda)
    _native.standard_normal(c.data_ptr(), c.numel(), key)
    return c.to(o.device).to(o.dtype)


def _rerun(backward: Callable[[list[Any], list[Any]], Sequence[Any]], inputs: Sequence[Any], cots: list[Any], i: int) -> Callable[[], Any]:
    """The backward run again on the same inputs and cotangents: its gradient of input `i`."""
    return lambda: _as_tuple(backward([_clone(x) for x in inputs], [_clone(c) for c in cots]))[i]


def _rerun_recorded(
    backward: Callable[[list[Any], list[Any]], Sequence[Any]], inputs: Sequence[Any], cots: list[Any], i: int, conformed: Callable[[Any], Any]
) -> Callable[[], tuple[_Backward, PoisonEmpty, Any] | None]:
    """The backward run again with its launches' writers recorded: the run, its allocations and
    its gradient of input `i` (as compared); None where it fails."""

    def run() -> tuple[_Backward, PoisonEmpty, Any] | None:
        bwd, poison = _Backward(record=True), PoisonEmpty()
        try:
            with torch.no_grad(), intercepting(bwd), poison:
                g = conformed(_as_tuple(backward([_clone(x) for x in inputs], [_clone(c) for c in cots]))[i])
        except Exception:  # noqa: BLE001 - the first run gave the verdict; blame is best effort
            return None
        return (bwd, poison, g) if isinstance(g, torch.Tensor) else None

    return run


def _conformer(x: torch.Tensor, position: int, who: str) -> Callable[[Any], Any]:
    """A gradient of `x` as the check compares it (`conform`)."""
    return lambda g: conform(g, x, position, who)


def _replay(backward: Callable[[list[Any], list[Any]], Sequence[Any]], inputs: Sequence[Any], diff: list[int], cots: list[Any]) -> tuple[tuple, bool] | None:
    """The backward replayed with every float in f64 (its launches promoted; host code on the f64
    inputs and cotangents computes in f64, the float dtypes it asks for promoted as in the ground
    truth's forward: a partial `dW` allocated as f32 and summed is f64 here) on f64 inputs and
    cotangents: it differs from the ground truth only by f64 rounding unless it computes another
    function. Where host code cannot run on f64 tensors (it maps dtypes to Triton's through a
    table without f64), the replay runs again on f32 tensors, its launches still computing in
    f64 (judged against a limit of f32 stores: the second value, True). None where both fail (the
    calibrated tolerance then judges the gradients, as before the replay existed)."""
    for wide in (torch.float64, torch.float32):
        # Copies: a backward may write its inputs and cotangents in place.
        ins = [x.detach().to(wide, copy=True) if i in diff and x.is_floating_point() else _clone(x) for i, x in enumerate(inputs)]
        cs = [None if c is None else c.detach().to(wide, copy=True) for c in cots]
        promoting = PromoteFloats() if wide == torch.float64 else contextlib.nullcontext()
        launch = _promoted_run if wide == torch.float64 else _f64_run
        try:
            with torch.no_grad(), promoting, intercepting(launch):
                return _as_tuple(backward(ins, cs)), wide != torch.float64
        except Exception:  # noqa: BLE001 - a replay that fails gives no verdict; the run under test judges the backward
            continue
    return None


def _replayed(replay: tuple[tuple, bool] | None, i: int, x: torch.Tensor) -> torch.Tensor | None:
    """Input `i`'s gradient in the replay, where it has one (zeros for None)."""
    if replay is None or i >= len(replay[0]):
        return None
    g = replay[0][i]
    if g is None:
        return torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    if not isinstance(g, torch.Tensor):
        return None
    try:
        return conform(g, x.double(), i, "the replay")
    except GradientError:
        return None


def _rms(ts: list[torch.Tensor]) -> float:
    """Root-mean-square of the elements of `ts` (1 for none)."""
    n = sum(t.numel() for t in ts)
    s = sum(float((t.detach().double() ** 2).sum()) for t in ts)
    return (s / n) ** 0.5 if n and s else 1.0


class _Truth:
    """The ground truth: the forward run with the float inputs as autograd leaves, each launch a
    differentiable function whose backward is the engine's VJP; promoted to f64 with the host
    code unless `native` (then in the kernels' own dtypes). `notes` gets the note of each launch
    whose VJP kernel was refused (its truth is then the evaluator's)."""

    def __init__(self, forward: Callable[[list[Any]], tuple], inputs: Sequence[Any], diff: list[int], native: bool, notes: list[Any]) -> None:
        self.native = native
        self.diff = diff
        self.leaves: dict[int, torch.Tensor] = {}
        ins = []
        for i, x in enumerate(inputs):
            if i in diff:
                self.leaves[i] = x.detach().to(x.dtype if native else torch.float64).requires_grad_(True)
                ins.append(self.leaves[i].clone())
            elif not native and isinstance(x, torch.Tensor) and x.is_floating_point():
                # Every float in f64, as the CLI's ground truth has it (the same values): a launch
                # that reads a float input the check does not differentiate (RoPE's tables) then
                # still runs in place on the device.
                ins.append(x.detach().to(torch.float64, copy=True))
            else:
                ins.append(_clone(x))
        # Custom Functions in the forward are differentiated through their forward.
        with torch.enable_grad(), intercepting(_truth_launch(native, notes)), inlining():
            if native:
                self.outs = _as_tuple(forward(ins))
            else:
                with PromoteFloats():
                    self.outs = _as_tuple(forward(ins))
        refuse_opaque(self.outs)

    def grads(self, cots: list[Any], out_idx: list[int]) -> dict[int, torch.Tensor]:
        """The gradient of each differentiable input (by index) for the outputs' cotangents `cots`;
        inputs the outputs do not depend on are left out."""
        pairs = [
            (self.outs[i], cots[i].to(self.outs[i].dtype if self.native else torch.float64)) for i in out_idx if self.outs[i].requires_grad
        ]
        if not pairs:
            return {}
        gs = torch.autograd.grad([o for o, _ in pairs], [self.leaves[i] for i in self.diff], [c for _, c in pairs], retain_graph=True, allow_unused=True)
        return {i: g for i, g in zip(self.diff, gs) if g is not None}


def _finite(t: torch.Tensor, what: str, why: str) -> None:
    """Raises NonFiniteError naming the first NaN or infinite element of `t`."""
    bad = ~torch.isfinite(t.detach())
    if bool(bad.any()):
        first = int(bad.reshape(-1).nonzero()[0, 0])
        value = float(t.detach().reshape(-1)[first])
        raise non_finite(what, value, _native.unravel(first, list(t.shape)), why)


def _dt(t: torch.Tensor) -> str:
    from ._memory import dtype_name

    return dtype_name(t)


def _ptrs(*ts: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in ts)


def _param_names(f: Callable, n: int, skip: int = 0) -> list[str]:
    try:
        ps = list(inspect.signature(f).parameters.values())[skip:]
    except (TypeError, ValueError):
        ps = []
    names = [p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [names[i] if i < len(names) else f"input{i}" for i in range(n)]


def differentiated(inputs: Sequence[Any], names: Sequence[str], wrt: Sequence[int | str] | None) -> tuple[list[int], bool]:
    """Which inputs a check differentiates, as PyTorch's rules have it: those named by `wrt`
    (positions or names), else those that require grad, else every float tensor; and whether the
    caller said so (then a None gradient is a zero one, as torch takes it, and is compared)."""
    floats = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if wrt is not None:
        picked = [_position(w, names) for w in ([wrt] if isinstance(wrt, (int, str)) else wrt)]
        bad = [names[i] for i in picked if i not in floats]
        if bad:
            raise ValueError(f"wrt names inputs that are not float tensors: {', '.join(bad)}")
        return sorted(set(picked)), True
    marked = [i for i in floats if inputs[i].requires_grad]
    if marked:
        return marked, True
    if not floats:
        raise ValueError("no differentiable input: pass at least one float tensor")
    return floats, False


def _position(w: int | str, names: Sequence[str]) -> int:
    if isinstance(w, bool) or not isinstance(w, (int, str)):
        raise ValueError(f"wrt takes input positions or names, not {w!r}")
    if isinstance(w, int):
        if not -len(names) <= w < len(names):
            raise ValueError(f"wrt: no input at position {w} ({len(names)} inputs)")
        return w % len(names)
    if w not in names:
        raise ValueError(f"wrt: no input named `{w}` (inputs: {', '.join(names)})")
    return names.index(w)


def check_backward(
    forward: Callable[..., Any],
    backward: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    seed: int = 0,
    trials: int = 2,
    precision: str = "f64",
    rtol: float | None = None,
    atol: float | None = None,
    name: str | None = None,
    allow_non_finite: bool = False,
    autotune: int | str = 0,
    strict: bool = False,
    wrt: Sequence[int | str] | int | str | None = None,
    cotangents: Sequence[Any] | None = None,
) -> Report:
    inputs = list(inputs)
    names = _param_names(forward, len(inputs))
    diff, explicit = differentiated(inputs, names, wrt)
    opts = dict(
        seed=seed, trials=trials, precision=precision, rtol=rtol, atol=atol, allow_non_finite=allow_non_finite, strict=strict, cotangents=cotangents
    )
    return each_config(
        autotune,
        name or getattr(forward, "__name__", "check"),
        lambda n: run_check(
            n,
            names,
            inputs,
            lambda ins: forward(*ins),
            lambda ins, cots: backward(*ins, *[c for c in cots if c is not None]),
            diff=diff,
            explicit=explicit,
            who=f"the backward `{getattr(backward, '__name__', 'backward')}`",
            **opts,
        ),
    )


def check_function(
    fn: type,
    *args: Any,
    seed: int = 0,
    trials: int = 2,
    precision: str = "f64",
    rtol: float | None = None,
    atol: float | None = None,
    allow_non_finite: bool = False,
    autotune: int | str = 0,
    strict: bool = False,
    wrt: Sequence[int | str] | int | str | None = None,
    cotangents: Sequence[Any] | None = None,
    **kwargs: Any,
) -> Report:
    return check_call(
        fn, args, kwargs, seed=seed, trials=trials, precision=precision, rtol=rtol, atol=atol, allow_non_finite=allow_non_finite,
        autotune=autotune, strict=strict, wrt=wrt, cotangents=cotangents,
    )


def check_call(
    fn: type,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    seed: int = 0,
    trials: int = 2,
    precision: str = "f64",
    rtol: float | None = None,
    atol: float | None = None,
    allow_non_finite: bool = False,
    autotune: int | str = 0,
    strict: bool = False,
    wrt: Sequence[int | str] | int | str | None = None,
    cotangents: Sequence[Any] | None = None,
) -> Report:
    """`check_function(fn, *args, **kwargs)` with the check's options apart from `fn`'s keyword
    arguments (which may then have any name)."""
    opts = dict(seed=seed, trials=trials, precision=precision, rtol=rtol, atol=atol, allow_non_finite=allow_non_finite, strict=strict, cotangents=cotangents)
    names, inputs, call = _bind_function(fn, tuple(args), kwargs)
    diff, explicit = differentiated(inputs, names, wrt)
    backward = apply_under_test(fn, call, _forward_natively)
    return each_config(
        autotune,
        fn.__name__,
        lambda n: run_check(
            n,
            names,
            inputs,
            call,
            lambda ins, cots: backward(ins, cots, diff),
            diff=diff,
            explicit=explicit,
            who=f"Function {fn.__name__}Backward",
            nondiff_outputs=_not_differentiable,
            **opts,
        ),
    )


def _bind_function(fn: type, args: tuple, kwargs: dict) -> tuple[list[str], list[Any], Callable[[list[Any]], Any]]:
    """The inputs of `fn.apply(*args, **kwargs)`: the positional arguments, then the keyword ones
    naming positional parameters of `fn.forward`, with their names; and how to call `fn.apply`
    on such a list as the caller did (keyword arguments stay keywords)."""
    own_ctx = fn.setup_context is torch.autograd.function._SingleLevelFunction.setup_context
    skip = 1 if own_ctx else 0
    try:
        params = list(inspect.signature(fn.forward).parameters.values())[skip:]
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keys = [k for k in kwargs if k in positional[len(args) :]]
    rest = {k: v for k, v in kwargs.items() if k not in keys}
    inputs = list(args) + [kwargs[k] for k in keys]
    names = _param_names(fn.forward, len(args), skip=skip) + keys

    def call(ins: list[Any]) -> Any:
        return fn.apply(*ins[: len(args)], **dict(zip(keys, ins[len(args) :])), **rest)

    return names, inputs, call


def _not_differentiable(outs: tuple) -> set[int]:
    """Outputs `apply` left without grad (marked non-differentiable, or not float)."""
    return {i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and not o.requires_grad}


def _forward_natively(forward: Callable[[], Any]) -> Any:
    """Runs a Function's forward for its backward: its launches in the kernels' dtypes, or in
    f64 within the backward's f64 replay (whose saved tensors are then the ground truth's)."""
    with intercepting(_promoted_run if getattr(_handler(), "promoted", False) else _native_run):
        return forward()


def _native_run(call: LaunchCall) -> None:
    call.run()


def _f64_run(call: LaunchCall) -> None:
    """A launch computing in f64 on tensors of the kernels' dtypes."""
    call.run(promote=True)


def _promoted_run(call: LaunchCall) -> None:
    """A launch computing in f64 on f64 copies of the tensors, the host code promoting float
    dtypes: converted as the ground truth's forward converts its kernels."""
    call.run(promote=True)


_promoted_run.promoted = True  # type: ignore[attr-defined]

"""tilegrad: ground-truth gradients for Triton kernels, checked from Python.

`check_backward(forward, backward, inputs)` runs your own forward and backward functions, which
launch `@triton.jit` kernels and call torch, with every kernel launch executed by tilegrad's CPU
engine (no GPU needed), and compares the backward's gradients with the exact f64 gradient of the
whole forward, host code included. `check_function(MyFunction, *args)` does the same for a
`torch.autograd.Function` subclass. `autograd(fn)` makes any function that launches Triton kernels
differentiable with the ground-truth gradient. `launch` mode (`tilegrad.intercept()`) just runs
kernels on the CPU engine, on torch tensors or numpy arrays.
"""

from __future__ import annotations

import atexit
import contextlib
from typing import TYPE_CHECKING, Any, Callable

from . import _native
from ._intercept import LaunchCall, intercepting, using_backend
from ._report import NonFiniteError, Report
from ._threads import one_torch_thread
from ._watch_report import WatchedCall, WatchWarning

if TYPE_CHECKING:
    from ._watch import Watch

# The process must not exit while the GPU backend compiles kernels in the background: wait for
# them before the interpreter's finalization releases the CUDA libraries.
atexit.register(_native.wait_for_compiles)

__all__ = [
    "Report",
    "UsageError",
    "LaunchError",
    "NonFiniteError",
    "check_backward",
    "check_function",
    "autograd",
    "intercept",
    "use_autotune_config",
    "vjp",
    "watch",
    "WatchedCall",
    "WatchWarning",
]

UsageError = _native.UsageError
LaunchError = _native.LaunchError


def check_backward(
    forward: Callable[..., Any],
    backward: Callable[..., Any],
    inputs: Any,
    *,
    seed: int = 0,
    trials: int = 2,
    precision: str = "f64",
    rtol: float | None = None,
    atol: float | None = None,
    name: str | None = None,
    allow_non_finite: bool = False,
    autotune: int | str = 0,
    backend: str = "cpu",
    ground: str = "auto",
    strict: bool = False,
    wrt: Any = None,
    max_programs: int | None = None,
    cotangents: Any = None,
) -> Report:
    """Checks `backward` against the ground-truth gradient of `forward` on `inputs`.

    `forward(*inputs)` returns a tensor or a tuple of tensors; `backward(*inputs, *grad_outputs)`
    returns one gradient per input (None where there is none). Torch tensors (CPU or CUDA) use
    torch autograd through the host code; numpy arrays are supported where no torch is installed
    (the host code between launches is then not differentiated: see `tilegrad._numpy_check`).

    Which inputs are differentiated follows PyTorch: those `wrt` names (input positions or
    parameter names), else the float tensors that require grad, else every float tensor. Inside
    the forward, differentiated inputs require grad, as in training. A None gradient is
    PyTorch's "no gradient": for an input differentiated by default it is reported as not
    compared ("no gradient (None)"); for one asked for (`wrt`, `requires_grad`) it is a zero
    gradient and compared. A gradient whose shape torch would accept (the input expands to it) is
    summed to the input's shape, as torch does; one torch would reject fails with torch's message.
    A custom `torch.autograd.Function` applied in the forward is differentiated through its
    `forward`: its `backward` is never the ground truth.

    Tolerances are the CLI's: by dtype, and calibrated to the kernels' own rounding noise for
    f16/bf16 gradients and f32 ones computed through a tf32 `dot`, unless `rtol`/`atol` are given.
    A NaN or infinite input, ground-truth output or gradient raises `NonFiniteError` unless
    `allow_non_finite`. `autotune`: which config `@triton.autotune` kernels use (an index), or
    `"all"` to check each config in turn (the first failing report, named by its config, else the
    last). `backend`: where the kernel launches run, as the CLI's `--backend`: `"cpu"` (the
    reference interpreter), `"gpu"` (a CUDA GPU, same results and diagnostics; `UsageError` when
    none is usable), `"auto"`, or `"triton"` (CUDA tensors: each launch of the forward and of
    the backward runs on Triton itself, the code that ships, after tilegrad's GPU backend ran it
    from the same memory for its notes and errors; the gradients compared are Triton's, and
    where a launch's results differ from tilegrad's reading beyond rounding the report says so,
    `report.triton_differences`, a failure only where `strict`; the ground truth is tilegrad's). `ground`: how the ground truth's VJP of each launch is computed:
    `"kernels"` (the CLI's `--ground kernels`: the launch's VJP kernel, run on the backend; on
    CUDA tensors, in place), `"evaluator"` (the CPU evaluator), or `"auto"` (the default: VJP
    kernels where the launches run on the GPU, else the evaluator). A launch whose VJP kernel is
    refused gets its ground truth from the evaluator, with a note. `report.backend` says where
    the launches ran. A launch of more programs than `max_programs` (default 2^26, as the CLI's
    `--max-programs`) is refused before it runs (`UsageError` naming the kernel and the grid).

    `cotangents` (torch tensors: one per output of the forward, or a tensor for a single output)
    is the first trial's cotangent instead of a random one (a cotangent training actually passed:
    the report's trial 0), the other trials drawing theirs; None for an output gives it zeros, as
    torch materializes a missing gradient. A dense one keeps its strides (a transposed cotangent
    reaches the backward transposed); a broadcast one (`y.sum()` gives one) arrives as a dense
    copy.

    The check runs torch with one intra-op thread (restored after): its many small host ops
    otherwise contend with the engine's threads for the cores.

    Launches run as Triton's GPU backends run them: masked-off lanes of a load without `other`
    read 0, and programs storing the same value to one element do not race. Where a launch relies
    on either, the report carries a note (`report.notes`); `strict=True` makes notes failures.
    """
    inputs = list(inputs)
    opts = dict(seed=seed, trials=trials, precision=precision, rtol=rtol, atol=atol, name=name, allow_non_finite=allow_non_finite, autotune=autotune, strict=strict)
    with using_backend(backend, ground, max_programs, checks=True), one_torch_thread(inputs):
        if _has_torch_tensor(inputs):
            from ._check import check_backward as torch_check

            return torch_check(forward, backward, inputs, wrt=wrt, cotangents=cotangents, **opts)
        if backend == "triton":
            raise UsageError('backend="triton" runs the launches on Triton itself: it needs CUDA torch tensors')
        if wrt is not None:
            raise UsageError("`wrt` needs torch tensors; numpy checks differentiate every float array")
        if cotangents is not None:
            raise UsageError("`cotangents` needs torch tensors; numpy checks draw theirs")
        from ._numpy_check import check_backward as numpy_check

        return numpy_check(forward, backward, inputs, **opts)


def check_function(fn: type, *args: Any, backend: str = "cpu", ground: str = "auto", max_programs: int | None = None, **kwargs: Any) -> Report:
    """Checks the backward of a `torch.autograd.Function` subclass, called as `fn.apply(*args,
    **kwargs)` would call it. Options as for `check_backward` (`seed`, `trials`, `precision`,
    `rtol`, `atol`, `allow_non_finite`, `autotune`, `strict`, `wrt`, `cotangents`); every other
    keyword argument goes to `fn`.

    The differentiated inputs (as for `check_backward`) require grad inside `forward`; `fn.apply`
    runs under grad mode, then its backward through torch's autograd engine with a random
    cotangent per differentiable output: `ctx` is PyTorch's (`needs_input_grad`,
    `saved_tensors`, `mark_dirty`, `set_materialize_grads`), outputs marked non-differentiable
    get no cotangent, the cotangents are the backward's to overwrite, and the gradients are
    validated as torch validates them. The ground truth differentiates `fn.forward` itself."""
    from ._check import check_function as f

    with using_backend(backend, ground, max_programs, checks=True), one_torch_thread(list(args) + list(kwargs.values())):
        return f(fn, *args, **kwargs)


def autograd(fn: Callable[..., Any], *, precision: str = "f64") -> Callable[..., Any]:
    """`fn` (any function launching Triton kernels) made differentiable: its launches run on the
    engine, each with the engine's exact VJP (f64 unless `precision="native"`), and torch autograd
    differentiates the host code between them. Float results are f64 unless `precision="native"`.
    """
    from ._check import _truth_launch
    from ._functions import inlining
    from ._modes import PromoteFloats

    native = precision == "native"

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.enable_grad(), intercepting(_truth_launch(native, [])), inlining():
            if native:
                return fn(*args, **kwargs)
            args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
            with PromoteFloats():
                return fn(*args, **kwargs)

    wrapped.__name__ = getattr(fn, "__name__", "autograd")
    wrapped.__doc__ = fn.__doc__
    return wrapped


@contextlib.contextmanager
def intercept(*, poison: bool = False, backend: str = "cpu", max_programs: int | None = None):
    """Runs every Triton launch of the block on tilegrad's engine (the CPU reference, or
    `backend="gpu"`/`"auto"` as in `check_backward`), in place on the tensors' memory, with its
    diagnostics (out of bounds, races, loop bounds) raised as `LaunchError`. Yields the executor:
    `describe()` says where the launches ran."""

    def run(call: LaunchCall) -> None:
        call.run(poison=poison)

    with using_backend(backend, max_programs=max_programs) as executor, intercepting(run):
        yield executor


@contextlib.contextmanager
def use_autotune_config(index: int):
    """Launches through `@triton.autotune` use its config `index` (default 0) inside the block."""
    from . import _intercept

    prev = _intercept.autotune_config
    _intercept.autotune_config = index
    try:
        yield
    finally:
        _intercept.autotune_config = prev


def watch(
    model: Any = None,
    *,
    calls: int = 1,
    trials: int = 1,
    on_fail: str = "warn",
    max_elements: int | None = None,
    time_budget: float | None = None,
    rows: int | None = None,
    row_independent: Any = None,
    seed: int = 0,
    strict: bool = False,
    file: Any = None,
) -> Watch:
    """Checks the backward of every `torch.autograd.Function` whose forward launches Triton
    kernels (yours, or a library's; not torch's own) on a real training step, with the tensors
    it received and the cotangent autograd passes to its backward.

    `with tilegrad.watch() as w: ...` watches the calls made in this thread inside the block;
    `w = tilegrad.watch(model)` those made by `model`'s forward (in any thread) until
    `w.close()` (or `w.remove()`; `with tilegrad.watch(model): ...` closes at the block's end).
    A Function's first `calls` calls that launch kernels and take part in a backward are checked
    (the launches of a Function applied inside another's forward are the inner one's). Its
    inputs are copied before its forward runs; when autograd reaches its backward, the check
    (as `check_function`) runs on the copies with that cotangent as trial 0, then `trials`
    random ones (`seed`), on the GPU backend where the inputs are CUDA tensors, else the CPU's.
    Training is unchanged: the real forward and backward run as they would, on their tensors,
    and torch's random state is restored after each check. Watches do not nest their checks:
    a call goes to the innermost watch active in its thread, and the checker's own calls are
    not watched.

    `on_fail`: on a failing check (or one that could not run), `"raise"` raises from the
    backward (`AssertionError` whose first line is the verdict, as `Report.assert_passes`),
    `"warn"` (the default) warns (`WatchWarning`), `"log"` only records. The summary (a row per
    check: Function, call site, call number, input shapes and dtypes, the reports' formula and
    rounding figures, verdict; then failures and the calls not checked, with why) is printed to
    `file` (stderr by default) when the watch ends, and is `w.summary()`; `w.reports` has a
    `WatchedCall` per check, with its `Report`.

    Cost: `max_elements` skips (with a note) a call whose tensor inputs have more elements in
    all; `time_budget` (seconds) skips a Function's further calls once its checks took longer in
    total; `rows=N` with `row_independent` (Function classes, or a predicate on a class) checks
    those Functions on the first N entries of dimension 0 of the tensor inputs whose first
    dimension is that of the first tensor input (their cotangents cut alike), said in the summary.
    `strict` as for `check_backward`.

    `Fn.apply` is wrapped while a watch is active: a reference to it taken earlier (`f =
    Fn.apply` at import) is not seen. On CPU tensors, kernel launches need tilegrad's engine to
    run at all: train inside `tilegrad.intercept()`."""
    from ._watch import Watch

    return Watch(
        model,
        calls=calls,
        trials=trials,
        on_fail=on_fail,
        max_elements=max_elements,
        time_budget=time_budget,
        rows=rows,
        row_independent=row_independent,
        seed=seed,
        strict=strict,
        file=file,
    )


def vjp(
    fn: Callable[..., Any],
    inputs: Any,
    cotangents: Any,
    *,
    precision: str = "f64",
    backend: str = "cpu",
    ground: str = "auto",
    max_programs: int | None = None,
) -> list[Any]:
    """The ground-truth gradient of `fn(*inputs)` along `cotangents` (one per output), one entry per
    input (None for non-float inputs); works on numpy arrays without torch (kernel launches only).
    `backend` and `ground` as for `check_backward`."""
    with using_backend(backend, ground, max_programs), one_torch_thread():
        return _vjp(fn, list(inputs), cotangents, precision)


def _vjp(fn: Callable[..., Any], inputs: list[Any], cotangents: Any, precision: str) -> list[Any]:
    if _has_torch_tensor(inputs):
        import torch

        leaves = [x.detach().double().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        outs = autograd(fn, precision=precision)(*[x.clone() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in leaves])
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        cots = cotangents if isinstance(cotangents, (tuple, list)) else (cotangents,)
        pairs = [(o, torch.as_tensor(c).to(o.dtype)) for o, c in zip(outs, cots) if isinstance(o, torch.Tensor) and o.requires_grad]
        diff = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        gs = iter(torch.autograd.grad([o for o, _ in pairs], diff, [c for _, c in pairs], allow_unused=True))
        return [next(gs) if isinstance(x, torch.Tensor) and x.requires_grad else None for x in leaves]
    from ._numpy_check import vjp as numpy_vjp

    return numpy_vjp(fn, inputs, cotangents, precision=precision)


def _has_torch_tensor(xs: list[Any]) -> bool:
    from ._memory import is_torch

    return any(is_torch(x) for x in xs)

"""`tilegrad.watch`: the kernels of a model checked on a real training step.

While a watch is active, `torch.autograd.Function.apply` is wrapped (by the one wrapper of
`_functions`, with `_apply` as its handler: `_functions.watching`). A call of a Function whose
forward launches Triton kernels (counted by the interception of
`JITFunction.run`, `_intercept.launches`; the launches of Functions it applies inside are theirs)
has its inputs copied before the real `apply` runs (its forward may write them in place). A
pre-hook on its node in the autograd graph receives the cotangents autograd passes to its
backward; there the call is checked (`_check.check_call`) on the copies, the first trial with
those cotangents, then `trials` random ones. Training runs the real `apply` and backward on its
own tensors: the check runs on copies, with torch's random state saved and restored around it.

Which watch gets a call: the innermost one active in the calling thread (a context entered there,
or a model handle whose module's forward is running). The `apply` calls a check makes (this
watch's, or a `check_function` the user calls inside the block) are not watched
(`_functions.in_check`); nor are tilegrad's internal Functions.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TextIO

import torch

from . import _intercept
from ._functions import apply_original, in_check, watching
from ._watch_report import FunctionStats, WatchedCall, WatchWarning, summary

ON_FAIL = ("raise", "warn", "log")

_local = threading.local()
_lock = threading.Lock()
_users = 0
# Frames of these folders are not the call site of an `apply`: the user's code calls into them.
_LIBRARY_DIRS = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


@dataclass(eq=False)
class _Planned:
    """A call to check when its cotangents arrive: copies of the inputs it received."""

    cls: type
    stats: FunctionStats
    args: tuple
    kwargs: dict[str, Any]
    record: WatchedCall
    rows: tuple[int, int] | None  # (kept, of): the check's inputs are the first `kept` of `of` rows
    autotune: int  # the `@triton.autotune` config its launches use where tilegrad runs them
    hook: Any = None


@dataclass
class _Skip:
    """A call that is not checked, and why."""

    reason: str


class Watch:
    """What `tilegrad.watch(...)` returns: see `tilegrad.watch`."""

    def __init__(
        self,
        model: torch.nn.Module | None = None,
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
        file: TextIO | None = None,
    ) -> None:
        _validate(model, calls, trials, on_fail, max_elements, time_budget, rows, row_independent, file)
        _count("seed", seed, 0)
        if not isinstance(strict, bool):
            raise TypeError(f"strict: True or False, not {strict!r}")
        self.model = model
        self.calls, self.trials, self.on_fail, self.seed, self.strict = calls, trials, on_fail, seed, strict
        self.max_elements, self.time_budget, self.rows = max_elements, time_budget, rows
        self._row_independent = _row_predicate(row_independent)
        self.file = file
        self.reports: list[WatchedCall] = []
        self._stats: dict[type, FunctionStats] = {}
        self._pending: list[_Planned] = []
        self._mutex = threading.Lock()
        self._hooks: list[Any] = []
        self._state = "new"
        if model is not None:
            self._open()
            self._hooks = [
                model.register_forward_pre_hook(self._enter_forward),
                model.register_forward_hook(self._exit_forward, always_call=True),
            ]

    # -- the public handle ---------------------------------------------------------------------

    def __enter__(self) -> Watch:
        if self._state == "closed":
            raise RuntimeError("this watch is closed: use a new `tilegrad.watch(...)`")
        if self.model is None:
            if self._state != "new":
                raise RuntimeError("this watch was already entered: use a new `tilegrad.watch()`")
            self._open()
            _stack().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stops watching (restoring `Function.apply` when no other watch is active) and prints
        the summary to `file` (stderr by default). Calls still waiting for their backward are
        reported as such. A second call does nothing."""
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closed"
        for h in self._hooks:
            h.remove()
        self._hooks = []
        _remove(_stack(), self)
        with self._mutex:
            for plan in self._pending:
                plan.hook.remove()
                plan.args, plan.kwargs = (), {}
            self._pending = []
        _uninstall()
        print(self.summary(), end="", file=self.file if self.file is not None else sys.stderr)

    remove = close

    def summary(self) -> str:
        """The table of the calls checked (Function, call site, which call, input shapes and
        dtypes, the reports' formula and rounding figures, verdict), then the failures, the
        checks that could not run and the calls not checked, with why."""
        with self._mutex:
            return summary(list(self.reports), list(self._stats.values()), self.calls)

    @property
    def passed(self) -> bool:
        """Whether every call checked so far passed."""
        return all(r.passed for r in self.reports if r.done)

    def __repr__(self) -> str:
        done = sum(r.done for r in self.reports)
        return f"<tilegrad.watch {self._state}: {done} call{'' if done == 1 else 's'} checked>"

    # -- which calls: model hooks, the wrapped `apply` -----------------------------------------

    def _open(self) -> None:
        _install()
        self._state = "open"

    def _enter_forward(self, module: Any, args: Any) -> None:
        _stack().append(self)

    def _exit_forward(self, module: Any, args: Any, output: Any) -> None:
        _remove(_stack(), self)

    def _call(self, cls: type, args: tuple, kwargs: dict[str, Any]) -> Any:
        """`cls.apply(*args, **kwargs)` as training calls it, set up to be checked."""
        with self._mutex:
            stats = self._stats.setdefault(cls, FunctionStats(cls.__name__))
        wants = torch.is_grad_enabled() and _requires_grad(args, kwargs)
        plan = self._plan(cls, stats, args, kwargs) if wants and stats.launches is not False else None
        out, own = _counting_launches(lambda: apply_original(cls, args, kwargs))
        self._settle(stats, wants, plan, out, own)
        return out

    def _plan(self, cls: type, stats: FunctionStats, args: tuple, kwargs: dict[str, Any]) -> _Planned | _Skip | None:
        """What to do with a call before it runs: copy its inputs, skip it (with why), or let it
        pass (its Function's checks are done)."""
        if stats.scheduled >= self.calls:
            return None
        if self.time_budget is not None and stats.seconds > self.time_budget:
            return _Skip(f"its checks took {stats.seconds:.2f} s, over time_budget={self.time_budget:g} s")
        rows = None
        if self.rows is not None and self._row_independent(cls):
            args, kwargs, rows = _first_rows(cls, args, kwargs, self.rows)
        n = sum(x.numel() for x in _tensors(args, kwargs))
        if self.max_elements is not None and n > self.max_elements:
            return _Skip(f"inputs over max_elements={self.max_elements}")
        site, path = _call_site()
        described = [(list(x.shape), _dtype(x)) for x in _tensors(args, kwargs)]
        record = WatchedCall(cls.__name__, site, path, [s for s, _ in described], [d for _, d in described], 0, rows=None if rows is None else rows[2])
        copies = tuple(_copy(x) for x in args), {k: _copy(v) for k, v in kwargs.items()}
        return _Planned(cls, stats, *copies, record, None if rows is None else rows[:2], _intercept.autotune_config)

    def _settle(self, stats: FunctionStats, wants: bool, plan: _Planned | _Skip | None, out: Any, own: int) -> None:
        """After the real `apply`: whether the Function launches kernels, and the call's check
        hooked to its node in the graph."""
        with self._mutex:
            if own == 0:
                stats.launches = stats.launches or False
                return
            stats.launches = True
            if not wants:
                return
            stats.calls += 1
            if isinstance(plan, _Skip):
                stats.skipped[plan.reason] = stats.skipped.get(plan.reason, 0) + 1
                return
            node = _node(out)
            if plan is None or node is None:
                return
            stats.scheduled += 1
            plan.record.ordinal = stats.calls
            self.reports.append(plan.record)
            self._pending.append(plan)
            plan.hook = node.register_prehook(lambda grads: self._on_cotangents(plan, grads))

    # -- the check -----------------------------------------------------------------------------

    def _on_cotangents(self, plan: _Planned, grads: tuple) -> None:
        """The node's pre-hook: the cotangents its backward is about to get. Checks the call
        (once), then acts on the verdict; the backward then runs as it would have."""
        with self._mutex:
            if plan not in self._pending:  # checked already (a second backward), or closed
                return None
            self._pending.remove(plan)
        cots = [None if g is None else _first(g, plan.rows).detach().clone() for g in grads]
        error = self._check(plan, cots)
        self._act(plan.record, error)
        return None

    def _check(self, plan: _Planned, cots: list[Any]) -> Exception | None:
        """Runs the check of `plan` with `cots` as its first trial; the exception that kept it
        from running, if one did (recorded)."""
        from ._check import check_call
        from ._threads import one_torch_thread

        record = plan.record
        tensors = _tensors(plan.args, plan.kwargs)
        backend = "gpu" if any(x.is_cuda for x in tensors) else "cpu"
        start = time.perf_counter()
        error = None
        try:
            with _kept_rng(tensors), torch.enable_grad(), _intercept.using_backend(backend), one_torch_thread(tensors):
                opts = dict(trials=1 + self.trials, seed=self.seed, strict=self.strict, cotangents=cots, autotune=plan.autotune)
                record.report = check_call(plan.cls, plan.args, plan.kwargs, **opts)
        except Exception as e:  # noqa: BLE001 - a check that cannot run must not stop training
            record.error, error = f"{type(e).__name__}: {e}", e
        record.seconds, record.done = time.perf_counter() - start, True
        with self._mutex:
            plan.stats.seconds += record.seconds
        plan.args, plan.kwargs = (), {}
        return error

    def _act(self, record: WatchedCall, error: Exception | None) -> None:
        """`on_fail` for a failed check, or one that could not run."""
        __tracebackhide__ = True
        if record.status == "pass" or self.on_fail == "log":
            return
        if self.on_fail == "raise":
            if error is not None:
                raise error
            assert record.report is not None
            record.report.assert_passes()
        elif error is not None:
            message = f"tilegrad.watch: {record.function} at {record.site}: the check could not run: {record.error}"
            warnings.warn(message, WatchWarning, stacklevel=_user_stacklevel())
        else:
            assert record.report is not None
            warnings.warn(f"{record.report.summary()} [call at {record.site}]", WatchWarning, stacklevel=_user_stacklevel())


# -- the wrapped `Function.apply` -----------------------------------------------------------------


def _stack() -> list[Watch]:
    """The watches active in this thread, innermost last."""
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _remove(stack: list[Watch], w: Watch) -> None:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is w:
            del stack[i]
            return


def _current() -> Watch | None:
    """The watch a call in this thread goes to: none while a check runs (the checker's own)."""
    if in_check():
        return None
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def _apply(cls: type, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The handler of `apply` calls while a watch is active (`_functions.watching`)."""
    w = _current()
    if w is None or _torchs(cls):
        return apply_original(cls, args, kwargs)
    return w._call(cls, args, kwargs)


def _torchs(cls: type) -> bool:
    """A Function of torch itself (checkpointing, distributed): its kernels are those of the
    Functions it applies, which are watched; its inputs are not copied to find that out."""
    return cls.__module__ == "torch" or cls.__module__.startswith("torch.")


def _install() -> None:
    global _users
    _intercept.install()  # launches are counted from here on
    with _lock:
        if _users == 0:
            watching(_apply)
        _users += 1


def _uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            watching(None)


def _counting_launches(run: Callable[[], Any]) -> tuple[Any, int]:
    """`run()`'s result and the Triton launches it made itself (not those of the watched
    `apply` calls inside it)."""
    if not hasattr(_local, "nested"):
        _local.nested = []
    before = _intercept.launches()
    _local.nested.append(0)
    try:
        out = run()
    finally:
        inner = _local.nested.pop()
        total = _intercept.launches() - before
        if _local.nested:
            _local.nested[-1] += total
    return out, total - inner


# -- a call's inputs and outputs ----------------------------------------------------------------


def _tensors(args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    return [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]


def _requires_grad(args: tuple, kwargs: dict[str, Any]) -> bool:
    return any(x.requires_grad for x in _tensors(args, kwargs))


def _copy(x: Any) -> Any:
    """A tensor input as the check takes it: a copy (strides kept where dense), requiring grad
    as the original does; other arguments as they are."""
    if not isinstance(x, torch.Tensor):
        return x
    c = x.detach().clone()
    return c.requires_grad_(True) if x.requires_grad and c.is_floating_point() else c


def _dtype(x: torch.Tensor) -> str:
    from ._memory import _TORCH_DTYPES

    return _TORCH_DTYPES.get(str(x.dtype), str(x.dtype).removeprefix("torch."))


def _node(out: Any) -> Any:
    """The Function's node in the autograd graph (None where no output has one)."""
    outs = out if isinstance(out, tuple) else (out,)
    return next((o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)


def _user_stacklevel() -> int:
    """The `stacklevel` of `warnings.warn`, called by this function's caller, that names the
    innermost frame outside torch and tilegrad (the `backward()` call)."""
    level, f = 1, sys._getframe(1)
    while f.f_back is not None and f.f_code.co_filename.startswith(_LIBRARY_DIRS):
        f, level = f.f_back, level + 1
    return level


def _call_site() -> tuple[str, str]:
    """`file:line` of the innermost frame outside torch and tilegrad (the `apply` call), and
    the file's path."""
    f: Any = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_LIBRARY_DIRS):
        f = f.f_back
    if f is None:
        return "<unknown>", "<unknown>"
    path = f.f_code.co_filename
    return f"{os.path.basename(path)}:{f.f_lineno}", path


def _first_rows(cls: type, args: tuple, kwargs: dict[str, Any], n: int) -> tuple[tuple, dict[str, Any], tuple[int, int, str] | None]:
    """The inputs cut to their first `n` rows: the tensors whose first dimension is that of the
    first tensor input (of R rows, where R > n); with (n, R, what is said of it)."""
    from ._check import _bind_function

    first = next((x for x in _tensors(args, kwargs) if x.dim() >= 1), None)
    if first is None or first.shape[0] <= n:
        return args, kwargs, None
    total = first.shape[0]
    names = _bind_function(cls, args, {})[0][: len(args)] + list(kwargs)
    cut = [isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == total for x in (*args, *kwargs.values())]
    values = [x[:n] if c else x for x, c in zip((*args, *kwargs.values()), cut)]
    said = f"the first {n} of {total} rows of {', '.join(f'`{m}`' for m, c in zip(names, cut) if c)} (row_independent)"
    return tuple(values[: len(args)]), dict(zip(kwargs, values[len(args) :])), (n, total, said)


def _first(g: torch.Tensor, rows: tuple[int, int] | None) -> torch.Tensor:
    """A cotangent cut as the inputs were: its first rows where its first dimension is theirs."""
    if rows is None or g.dim() == 0 or g.shape[0] != rows[1]:
        return g
    return g[: rows[0]]


@contextlib.contextmanager
def _kept_rng(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Torch's random state (the CPU's, and that of the CUDA devices of `tensors`) as it was
    before the block: a check does not change what training draws next."""
    devices = sorted({x.device.index or 0 for x in tensors if x.is_cuda})
    with torch.random.fork_rng(devices=devices):
        yield


# -- options ------------------------------------------------------------------------------------


def _validate(
    model: Any, calls: Any, trials: Any, on_fail: Any, max_elements: Any, time_budget: Any, rows: Any, row_independent: Any, file: Any
) -> None:
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"watch(model): a torch.nn.Module, not {type(model).__name__}")
    _count("calls", calls, 1)
    _count("trials", trials, 0)
    if on_fail not in ON_FAIL:
        raise ValueError(f"on_fail must be one of {', '.join(map(repr, ON_FAIL))}, not {on_fail!r}")
    if max_elements is not None:
        _count("max_elements", max_elements, 1)
    if time_budget is not None and (isinstance(time_budget, bool) or not isinstance(time_budget, (int, float)) or not time_budget > 0):
        raise ValueError(f"time_budget: seconds, a number above 0 (or None), not {time_budget!r}")
    if rows is not None:
        _count("rows", rows, 1)
    if (rows is None) != (row_independent is None):
        raise ValueError("rows= and row_independent= go together: rows says how many rows of the Functions row_independent names are checked")
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"file: a text stream with `write`, not {type(file).__name__}")


def _count(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int of at least {least}, not {value!r}")


def _row_predicate(row_independent: Any) -> Callable[[type], bool]:
    """Which Functions `rows=` cuts: those of a class given (or a subclass), or those a
    predicate accepts."""
    if row_independent is None:
        return lambda cls: False
    if isinstance(row_independent, type):
        row_independent = {row_independent}
    if callable(row_independent):
        return lambda cls: bool(row_independent(cls))
    if not isinstance(row_independent, Iterable) or isinstance(row_independent, (str, bytes)):
        raise TypeError(f"row_independent: Function classes or a predicate on them, not {type(row_independent).__name__}")
    classes = tuple(row_independent)
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, torch.autograd.Function))]
    if bad:
        raise TypeError(f"row_independent: {bad[0]!r} is not a torch.autograd.Function subclass")
    return lambda cls: issubclass(cls, classes)

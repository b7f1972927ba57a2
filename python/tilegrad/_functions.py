"""Custom `torch.autograd.Function`s in a check, as PyTorch runs them.

- The ground truth never runs a Function's `backward` (the code under test, or a library's):
  while the truth's forward runs (`inlining`), `Fn.apply` calls `Fn.forward` directly under grad
  mode, with a ctx offering what PyTorch's offers inside `forward`, so that autograd records the
  launches (each differentiated by the engine) and host code inside it. A Function that still
  reaches the truth's graph as itself (`apply` called through a reference taken before the check)
  is refused by name (`refuse_opaque`), as is a forward whose output autograd cannot follow.
- `check_function` runs the Function under test as training does (`apply_under_test`): `Fn.apply`
  under grad mode on inputs that require grad, then its backward through torch's autograd engine,
  which gives it PyTorch's ctx, `needs_input_grad`, materialized cotangents, and validates the
  gradients it returns (`sum_to` where torch accepts a shape, torch's error where not).
- `conform` applies torch's rule for a gradient's shape and dtype to a plain backward's gradients.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Callable, Sequence

import torch

from . import _native
from ._intercept import thread_state, with_thread_state

_state = threading.local()
_lock = threading.Lock()
_users = 0
_original_apply: Any = None
# `watch`'s handler of `apply` calls outside the ground truth's inlining, while a watch is
# active (`watching`): one wrapper of `Function.apply` serves both, so that neither can leave the
# other's wrapper installed.
_outer: Callable[[type, tuple, dict], Any] | None = None


class GradientError(Exception):
    """The gradients a backward returned are ones PyTorch rejects (the message is torch's)."""


@contextlib.contextmanager
def checking():
    """Marks the block as a check running in this thread: the `apply` calls it makes are the
    checker's own, which `watch` leaves alone."""
    _state.checks = getattr(_state, "checks", 0) + 1
    try:
        yield
    finally:
        _state.checks -= 1


def in_check() -> bool:
    """Whether a check is running in this thread (`checking`)."""
    return bool(getattr(_state, "checks", 0))


def is_internal(cls: type) -> bool:
    """A Function of tilegrad's own (a launch of the ground truth): applied as it is."""
    return bool(getattr(cls, "_tilegrad_internal", False))


class InlineCtx:
    """The `ctx` of a Function whose forward the ground truth differentiates: what PyTorch's
    ctx offers inside `forward`, recorded (its backward is never called)."""

    def __init__(self, args: Sequence[Any]) -> None:
        self.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        self.to_save: tuple = ()
        self.dirty_tensors: tuple = ()
        self.non_differentiable: tuple = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        self.to_save = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    @property
    def saved_tensors(self) -> tuple:
        return self.to_save

    def mark_dirty(self, *tensors: Any) -> None:
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


@contextlib.contextmanager
def inlining():
    """While the block runs in this thread, `Fn.apply` differentiates through `Fn.forward`."""
    _install()
    prev = getattr(_state, "active", False)
    _state.active = True
    try:
        yield
    finally:
        _state.active = prev
        _uninstall()


def _install() -> None:
    global _users, _original_apply
    with _lock:
        if _users == 0:
            _original_apply = torch.autograd.Function.__dict__["apply"]
            torch.autograd.Function.apply = classmethod(_apply)  # type: ignore[method-assign, assignment]
        _users += 1


def _uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            torch.autograd.Function.apply = _original_apply  # type: ignore[method-assign]


def watching(handler: Callable[[type, tuple, dict], Any] | None) -> None:
    """Installs `handler` of `apply` calls (`watch`'s; `apply_original` runs a call as torch
    would), or with None removes it."""
    global _outer
    if handler is not None:
        _install()
        _outer = handler
    elif _outer is not None:
        _outer = None
        _uninstall()


def apply_original(cls: type, args: tuple, kwargs: dict) -> Any:
    """`cls.apply(*args, **kwargs)` as torch runs it."""
    return _original_apply.__get__(None, cls)(*args, **kwargs)


def _apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    if is_internal(cls):
        return apply_original(cls, args, kwargs)
    if getattr(_state, "active", False):
        return _inline(cls, args, kwargs)
    handler = _outer
    return apply_original(cls, args, kwargs) if handler is None else handler(cls, args, kwargs)


def _forward_args(cls: type, args: tuple, kwargs: dict, skip: int) -> list[Any]:
    """The forward's positional arguments as `apply` binds them (keywords by position)."""
    try:
        bound = inspect.signature(cls.forward).bind(*([None] * skip), *args, **kwargs)
    except (TypeError, ValueError):
        return list(args)
    return list(bound.args[skip:])


def _inline(cls: type, args: tuple, kwargs: dict) -> Any:
    own_ctx = cls.setup_context is torch.autograd.function._SingleLevelFunction.setup_context
    ctx = InlineCtx(_forward_args(cls, args, kwargs, 1 if own_ctx else 0))
    with torch.enable_grad():
        if own_ctx:
            out = cls.forward(ctx, *args, **kwargs)
        else:
            out = cls.forward(*args, **kwargs)
            cls.setup_context(ctx, args, out)
    return _as_applied(cls, ctx, args, out)


def _as_applied(cls: type, ctx: InlineCtx, args: tuple, out: Any) -> Any:
    """The forward's outputs as `apply` returns them: those marked non-differentiable detached;
    an output autograd cannot follow back to the inputs refused."""
    many = isinstance(out, tuple)
    outs = list(out) if many else [out]
    marked = {id(t) for t in ctx.non_differentiable}
    inputs = {id(a) for a in args}
    differentiated = any(ctx.needs_input_grad)
    for k, o in enumerate(outs):
        if not isinstance(o, torch.Tensor) or id(o) in inputs:
            continue
        if id(o) in marked:
            outs[k] = o.detach()
        elif differentiated and o.is_floating_point() and not o.requires_grad:
            where = f"output {k}" if many else "its output"
            raise _native.UsageError(
                f"the ground truth cannot differentiate through `{cls.__name__}.forward`: {where} does not depend on "
                "the differentiated inputs through torch operations or Triton launches (computed under no_grad, "
                f"detached, or outside torch); tilegrad never takes `{cls.__name__}.backward` as the ground truth"
            )
    return tuple(outs) if many else outs[0]


def refuse_opaque(outs: Sequence[Any]) -> None:
    """Raises UsageError naming a user Function whose backward the truth's graph would run."""
    for node in _nodes(outs):
        cls = getattr(node, "_forward_cls", None)
        if cls is not None and not is_internal(cls):
            raise _native.UsageError(
                f"the forward applies `{cls.__name__}` as an autograd Function whose backward would make the ground "
                f"truth (its `apply` was reached through a reference taken before the check, such as "
                f"`f = {cls.__name__}.apply`): call `{cls.__name__}.apply(...)` in the forward, so that tilegrad "
                f"differentiates `{cls.__name__}.forward`, or check it with `check_function`"
            )


def requiring_grad(ins: Sequence[Any], diff: Sequence[int]) -> list[Any]:
    """`ins` as training gives them to a Function: the differentiated ones require grad (and are
    not leaves, as activations are not: in-place writes are allowed)."""
    return with_leaves(ins, diff)[0]


def with_leaves(ins: Sequence[Any], diff: Sequence[int]) -> tuple[list[Any], dict[int, torch.Tensor]]:
    """`requiring_grad(ins, diff)`, and the leaf each differentiated input is a copy of: the
    gradient is taken with respect to it, since a Function working in place (`mark_dirty`) turns
    the input it got into its output."""
    leaves = {i: ins[i].detach().requires_grad_(True) for i in diff}
    with torch.enable_grad():
        return [leaves[i].clone() if i in diff else x for i, x in enumerate(ins)], leaves


def apply_under_test(
    fn: type, apply: Callable[[list[Any]], Any], run_forward: Callable[[Callable[[], Any]], Any]
) -> Callable[[list[Any], list[Any], Sequence[int]], list[Any]]:
    """The backward of `fn` as training runs it, as a check's `backward(ins, cots, diff)`:
    `apply(ins)` (`fn.apply` on them) under grad mode, its launches run by `run_forward`, then
    torch's engine from the outputs' cotangents to the differentiated inputs `diff`. One
    gradient per input, None where none."""

    def backward(ins: list[Any], cots: list[Any], diff: Sequence[int]) -> list[Any]:
        xs, leaves = with_leaves(ins, diff)
        with torch.enable_grad():
            outs = run_forward(lambda: apply(xs))
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, c) for o, c in zip(outs, cots) if isinstance(o, torch.Tensor) and o.requires_grad and c is not None]
        _carry_context(fn, [o for o, _ in pairs])
        try:
            gs = torch.autograd.grad([o for o, _ in pairs], [leaves[i] for i in diff], [c for _, c in pairs], allow_unused=True)
        except RuntimeError as e:
            if any(m in str(e) for m in _TORCH_REJECTS):
                raise GradientError(str(e)) from e
            raise
        grads: list[Any] = [None] * len(ins)
        for i, g in zip(diff, gs):
            grads[i] = g
        return grads

    return backward


# What torch's engine says of gradients it rejects (python_function.cpp, engine.cpp).
_TORCH_REJECTS = ("returned an invalid gradient", "returned an incorrect number of gradients", "returned a gradient different than None")


def _carry_context(fn: type, outs: Sequence[Any]) -> None:
    """The engine runs a backward without the caller's torch function modes (the check's record
    of `torch.empty` allocations), and a CUDA graph's backward on its own threads: each node of
    `fn` in the graph runs its backward with this thread's modes, launch handler and executor."""
    state = thread_state()
    modes = list(torch.overrides._get_current_function_mode_stack())
    for node in _nodes(outs):
        if getattr(node, "_forward_cls", None) is not fn or "apply" in getattr(node, "__dict__", {}):
            continue
        original = node.apply

        def apply(*grads: Any, _original: Any = original) -> Any:
            with with_thread_state(state), contextlib.ExitStack() as stack:
                for mode in modes:
                    stack.enter_context(mode)
                return _original(*grads)

        node.apply = apply


def _nodes(outs: Sequence[Any]) -> list[Any]:
    """The autograd graph's nodes from `outs` back."""
    seen: dict[int, Any] = {}
    stack = [o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(n for n, _ in node.next_functions)
    return list(seen.values())


def conform(g: Any, x: torch.Tensor, index: int, who: str) -> Any:
    """The gradient `g` of input `x` as torch's engine takes it (`validate_outputs`): summed to
    `x`'s shape where `x` expands to `g`'s, cast to `x`'s dtype; GradientError with torch's
    message where the shape is incompatible. `index`: `x`'s position among the tensor inputs."""
    if not isinstance(g, torch.Tensor):
        return g
    if g.shape != x.shape:
        try:
            expands = torch.broadcast_shapes(x.shape, g.shape) == g.shape
        except RuntimeError:
            expands = False
        if not expands:
            raise GradientError(
                f"{who} returned an invalid gradient at index {index} - got {list(g.shape)} but expected shape "
                f"compatible with {list(x.shape)}"
            )
        g = g.sum_to_size(x.shape)
    return g.to(x.dtype) if g.dtype != x.dtype and g.is_floating_point() else g

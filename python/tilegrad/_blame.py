"""Blame for a wrong gradient element: the CLI's blame, through the user's host code.

A gradient a backward returns was written by a kernel, or computed by torch from tensors kernels
wrote (`dW = partial.sum(0)` over per-program partial rows), or kept from an allocation no one
filled. To explain its worst element, the backward is run again (only when a gradient fails)
with every launch snapshotted (`_native.Pass`, the CLI's blame and data-flow slices) and every
torch op noted (`HostTrace`: the op, the user's line that called it, its inputs). The element is
then followed back from the returned tensor: through host ops (each one a "via" line naming the
user's source line, its input elements found by differentiating the op alone), to the launch
that wrote each element it came from, whose stores and data flow follow. Only the tensors the
element was actually computed from are blamed; an unrelated allocation is never.

Storages are named by their address: every tensor the recording notes (the launches' storages,
each host op's inputs and result) is held until the explanation is done, so the allocator cannot
hand an address noted for one tensor to another in the meantime.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from . import _native
from ._intercept import LaunchCall, intercepting, observing
from ._modes import PoisonEmpty

_PKG = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
# Host tensors followed at most per blamed element (a reduction over a large tensor).
_MAX_ELEMENTS = 4096
_MAX_DEPTH = 16
_ALLOC = {
    "empty": "NaN",
    "empty_like": "NaN",
    "empty_strided": "NaN",
    "new_empty": "NaN",
    "new_empty_strided": "NaN",
    "zeros": "zero",
    "zeros_like": "zero",
    "new_zeros": "zero",
    "ones": "one",
    "ones_like": "one",
    "new_ones": "one",
    "full": "its fill value",
    "full_like": "its fill value",
    "new_full": "its fill value",
}


def _run(call: LaunchCall) -> None:
    call.run()


def storage_key(t: torch.Tensor) -> tuple:
    return ("torch", str(t.device), t.untyped_storage().data_ptr())


def storage_elements(t: torch.Tensor, flat: list[int]) -> list[int]:
    """Storage elements of the row-major elements `flat` of `t`."""
    out = []
    for i in flat:
        idx = _native.unravel(i, list(t.shape)) if t.dim() else []
        out.append(t.storage_offset() + sum(a * s for a, s in zip(idx, t.stride())))
    return out


def _positions(t: torch.Tensor, elems: list[int]) -> dict[int, int]:
    """Row-major position in `t` of each of the storage elements `elems` it covers."""
    if t.numel() == 0 or not elems:
        return {}
    n = t.untyped_storage().nbytes() // t.element_size()
    where = torch.arange(n).as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)
    hit = torch.isin(where, torch.tensor(elems, dtype=where.dtype)).nonzero().reshape(-1)
    return {int(where[p]): int(p) for p in hit.tolist()}


@dataclass
class _Launch:
    step: int
    call: LaunchCall
    rec: Any


@dataclass
class _HostOp:
    func: Callable
    name: str
    args: tuple  # as the op read them (tensors cloned for an in-place op)
    kwargs: dict
    inputs: list[torch.Tensor]  # the tensors it was given, in the order of `_tensors((args, kwargs))`
    names: list[str | None]  # each input's name in the calling frame
    out: torch.Tensor
    out_index: int
    where: str  # file:line
    text: str  # the source line


@dataclass
class _Alloc:
    out: torch.Tensor
    init: str
    where: str


def _package_dir(name: str) -> str | None:
    mod = sys.modules.get(name)
    f = getattr(mod, "__file__", None)
    return os.path.dirname(os.path.abspath(f)) if f else None


def _user_frame(frame: Any) -> Any:
    """The innermost frame from `frame` out that is not torch's; None when that frame is
    tilegrad's or Triton's (the check's own torch calls)."""
    triton = _package_dir("triton")
    while frame is not None:
        f = frame.f_code.co_filename
        if f.startswith("<") and "frozen" in f:
            frame = frame.f_back
            continue
        af = os.path.abspath(f)
        if af.startswith(_TORCH + os.sep):
            frame = frame.f_back
            continue
        if af.startswith(_PKG + os.sep) or (triton is not None and af.startswith(triton + os.sep)):
            return None
        return frame
    return None


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


_IOPS = {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift", "rshift", "matmul")}
# In-place methods that change no element.
_NOT_WRITES = {"requires_grad_", "retain_grad", "share_memory_", "record_stream", "detach_", "resize_", "set_"}
# Ops that copy (or convert) one tensor: followed through without a line of their own.
_COPIES = {"clone", "contiguous", "to", "type", "float", "double", "half", "bfloat16", "detach", "copy_", "reshape", "flatten", "view_as", "reshape_as"}


def _inplace(name: str, kwargs: dict) -> bool:
    """The op writes into its first argument (or into `out=`)."""
    if name in _NOT_WRITES:
        return False
    return (name.endswith("_") and not name.startswith("_")) or name in _IOPS or name == "__setitem__" or "out" in kwargs


def _snapshot(x: Any) -> Any:
    """`x` with its tensors cloned (the inputs of an in-place op as they were)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_snapshot(v) for v in x)
    return x


def _local_name(t: torch.Tensor, local: list[tuple[str, Any]]) -> str | None:
    """The calling frame's name of `t`, or `name (a view)` of a local `t` views."""
    name = next((k for k, v in local if v is t), None)
    if name is None:
        try:
            key = storage_key(t)
            name = next((f"{k} (a view)" for k, v in local if isinstance(v, torch.Tensor) and storage_key(v) == key), None)
        except (RuntimeError, NotImplementedError):  # a tensor without a storage
            return None
    return name


class HostTrace(TorchFunctionMode):
    """Notes each torch op the user's code calls that makes or writes a tensor, in order with
    the launches (`events`, shared with the launch handler)."""

    def __init__(self, events: list[Any]) -> None:
        super().__init__()
        self.events = events

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        frame = _user_frame(sys._getframe(1))
        if frame is None or name.startswith("__get") or name in _NOT_WRITES or name in ("size", "dim", "stride", "numel", "data_ptr"):
            return func(*args, **kwargs)
        inplace = _inplace(name, kwargs)
        saved = (_snapshot(args), {k: _snapshot(v) for k, v in kwargs.items()}) if inplace else (args, kwargs)
        out = func(*args, **kwargs)
        if out is None and inplace and args and isinstance(args[0], torch.Tensor):
            out = args[0]  # `__setitem__`
        self._note(func, name, (args, kwargs), saved, out, frame, inplace)
        return out

    def _note(self, func: Callable, name: str, given: tuple, saved: tuple, out: Any, frame: Any, inplace: bool) -> None:
        outs = _tensors(out)
        if not outs:
            return
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        base = name.split(".")[-1]
        if base in _ALLOC and not inplace:
            for o in outs:
                self.events.append(_Alloc(o, _ALLOC[base], f"{base} at {where}"))
            return
        ins = _tensors(given)
        in_keys = {storage_key(t) for t in ins}
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        local = list(frame.f_locals.items())
        names = [_local_name(t, local) for t in ins]
        for j, o in enumerate(outs):
            if not inplace and storage_key(o) in in_keys:
                continue  # a view of an input: it writes nothing
            self.events.append(_HostOp(func, name, saved[0], saved[1], ins, names, o, j, where, text))


class Recording:
    """The backward re-run for blame: launches snapshotted into a `_native.Pass`, host ops noted."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.native = _native.Pass()
        self.names: dict[tuple, str] = {}
        self.poison = PoisonEmpty()

    def __call__(self, call: LaunchCall, rec: Any) -> None:
        """Observes a launch that ran (`_intercept.observing`)."""
        tensors = [(self._name(s), self._origin(s.key)) for s in call.storages.items]
        step = self.native.push(rec, tensors)
        self.events.append(_Launch(step, call, rec))

    def _name(self, s: Any) -> str:
        if s.key not in self.names:
            base = "/".join(dict.fromkeys(s.names))
            taken = set(self.names.values())
            name, n = base, 2
            while name in taken:
                name, n = f"{base}#{n}", n + 1
            self.names[s.key] = name
        return self.names[s.key]

    def _origin(self, key: tuple) -> str:
        for ev in reversed(self.events):
            if isinstance(ev, _Alloc) and storage_key(ev.out) == key:
                return {"NaN": "empty", "zero": "zeros"}.get(ev.init, "given")
            if isinstance(ev, _HostOp) and storage_key(ev.out) == key:
                return "given"
        return "given"

    def run(self, backward: Callable[[], Any]) -> Any:
        """Runs `backward` recorded; its result."""
        with torch.no_grad(), intercepting(_run), observing(self), self.poison, HostTrace(self.events):
            return backward()


# A host step on the way to a blamed element: (source line, file:line, op, what it read).
_Via = tuple[str, str, str, str]


def _lines(via: list[_Via]) -> list[str]:
    """The report's "via" lines of host steps, consecutive ops of one source line merged."""
    merged: list[list[Any]] = []
    for text, where, op, read in via:
        if merged and merged[-1][:2] == [text, where]:
            merged[-1][2].append(op)
            merged[-1][3] = read
        else:
            merged.append([text, where, [op], read])
    out = []
    for text, where, ops, read in merged:
        o = ", ".join(f"`{x}`" for x in ops)
        head = f"`{text}` at {where} (torch {o})" if text else f"torch {o} at {where}"
        out.append(f"{head}: from {read}" if read else head)
    return out


class Explainer:
    """Follows one element of a recorded backward's result back to what computed it."""

    def __init__(self, rec: Recording, values: tuple[float, float] | None) -> None:
        self.rec = rec
        self.values = values
        self.blames: list[Any] = []
        self.via: list[str] = []
        self.sites: list[Any] = []

    def element(self, g: torch.Tensor, flat: int) -> None:
        self.follow(storage_key(g), storage_elements(g, [flat]), len(self.rec.events), [], 0, "the gradient")

    def follow(self, key: tuple, elems: list[int], before: int, via: list[_Via], depth: int, label: str) -> None:
        """Blames storage elements `elems` of the storage `key` as they were before event
        `before`, reached through the host steps `via`; `label` names the tensor there."""
        elems = list(dict.fromkeys(elems))[:_MAX_ELEMENTS]
        for seq in range(before - 1, -1, -1):
            if not elems or depth > _MAX_DEPTH:
                return
            ev = self.rec.events[seq]
            if isinstance(ev, _Launch):
                elems = self._launch(ev, key, elems, via)
            elif isinstance(ev, _HostOp) and storage_key(ev.out) == key:
                elems = self._host(ev, seq, elems, via, depth)
            elif isinstance(ev, _Alloc) and storage_key(ev.out) == key:
                pos = _positions(ev.out, elems)
                if pos:
                    self._unwritten(ev.out, sorted(pos.values()), f" ({ev.where})", ev.init, via)
                    elems = [e for e in elems if e not in pos]
        if elems and depth <= _MAX_DEPTH:
            self.sites.append(_native.Site.given(self.rec.names.get(key, label)))
            self._via(via)

    def _via(self, via: list[_Via]) -> None:
        self.via.extend(v for v in _lines(via) if v not in self.via)

    def _made_by(self, x: torch.Tensor, before: int) -> str | None:
        """`sum(...)`: what made the unnamed tensor `x` (a host op's result used directly)."""
        for ev in reversed(self.rec.events[:before]):
            if isinstance(ev, _HostOp) and ev.out is x:
                return f"{ev.name}(...)"
        return None

    def _launch(self, ev: _Launch, key: tuple, elems: list[int], via: list[_Via]) -> list[int]:
        m = next((i for i, s in enumerate(ev.call.storages.items) if s.key == key), None)
        if m is None:
            return elems
        wrote = ev.rec.wrote(m, elems)
        hit = [e for e, w in zip(elems, wrote) if w]
        if hit:
            name = self.rec.names[key]
            exp, got = self.values if self.values is not None else (None, None)
            self.blames.append(self.rec.native.blame(ev.step, name, hit, _lines(via), None if via else exp, got))
        return [e for e, w in zip(elems, wrote) if not w]

    def _unwritten(self, t: torch.Tensor, flat: list[int], desc: str, init: str, via: list[_Via]) -> None:
        index = _native.unravel(flat[0], list(t.shape)) if t.dim() else []
        name = f"tensor{desc}"
        self.sites.append(_native.Site.never_written(name, index, len(flat), init))
        self._via(via)

    def _host(self, ev: _HostOp, seq: int, elems: list[int], via: list[_Via], depth: int) -> list[int]:
        pos = _positions(ev.out, elems)
        if not pos:
            return elems
        deps = [(j, flat) for j, flat in _dependencies(ev, sorted(pos.values())) if flat]
        followed = False
        for j, flat in deps:
            x = ev.inputs[j]
            xname = ev.names[j] or self._made_by(x, seq) or f"input {j}"
            step = via if ev.name in _COPIES and len(deps) == 1 else via + [(ev.text, ev.where, ev.name, f"`{xname}`{_index_text(x, flat)}")]
            self.follow(storage_key(x), storage_elements(x, flat), seq, step, depth + 1, xname)
            followed = True
        if not followed:
            # Computed from no float tensor (a constant, integers): the host line is the origin.
            self._via(via + [(ev.text, ev.where, ev.name, "")])
        return [e for e in elems if e not in pos]


def _index_text(x: torch.Tensor, flat: list[int]) -> str:
    """`[:, 63]`: the multi-index of the elements `flat` of `x`, `:` where they differ."""
    if x.dim() == 0:
        return ""
    idx = [_native.unravel(i, list(x.shape)) for i in flat]
    parts = [str(idx[0][a]) if all(i[a] == idx[0][a] for i in idx) else ":" for a in range(x.dim())]
    return "[" + ", ".join(parts) + "]"


def _dependencies(ev: _HostOp, out_flat: list[int]) -> list[tuple[int, list[int]]]:
    """For each float tensor input of the op (by position in `ev.inputs`): the row-major
    elements of it that elements `out_flat` of its output depend on (found by differentiating
    the op alone in f64)."""
    given = _tensors((ev.args, ev.kwargs))
    ins = [(j, t) for j, t in enumerate(given) if t.is_floating_point()]
    if not ins:
        return []
    leaves = {id(t): t.detach().double().requires_grad_(True) for _, t in ins}

    def swap(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and id(x) in leaves:
            leaf = leaves[id(x)]
            return leaf.clone().to(x.dtype) if x.dtype != torch.float64 else leaf.clone()
        if isinstance(x, (list, tuple)):
            return type(x)(swap(v) for v in x)
        return x

    try:
        with torch.enable_grad():
            args = swap(ev.args)
            res = ev.func(*args, **{k: swap(v) for k, v in ev.kwargs.items()})
            out = args[0] if res is None else _tensors(res)[ev.out_index]
            picked = out.reshape(-1)[torch.tensor(out_flat, device=out.device)]
            cot = torch.linspace(1.0, 2.0, len(out_flat), dtype=picked.dtype, device=picked.device)
            grads = torch.autograd.grad((picked * cot).sum(), [leaves[id(t)] for _, t in ins], allow_unused=True)
    except Exception:  # noqa: BLE001 - an op that cannot be differentiated: follow the same elements
        return [(j, out_flat) for j, t in ins if t.numel() == ev.out.numel()]
    return [(j, gr.reshape(-1).nonzero().reshape(-1).tolist()) for (j, _), gr in zip(ins, grads) if gr is not None]


def explain(again: Callable[[], Any], flat: int, values: tuple[float, float] | None) -> Explainer | None:
    """Runs `again` (the backward, returning the gradient to explain) recorded and follows its
    row-major element `flat`. None when it does not run again or returns no tensor."""
    rec = Recording()
    try:
        g = rec.run(again)
    except Exception:  # noqa: BLE001 - the first run already gave the verdict; blame is best effort
        return None
    if not isinstance(g, torch.Tensor) or flat >= g.numel():
        return None
    e = Explainer(rec, values)
    e.element(g, flat)
    return e

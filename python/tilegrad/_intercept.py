"""Interception of Triton kernel launches.

`kernel[grid](*args)` ends in `JITFunction.run`; `@triton.autotune` and `@triton.heuristics`
wrappers end in their own `run`, which pick meta-parameters and call the inner one. While a
handler is active (`intercepting`), tilegrad replaces these `run` methods: a launch is bound to the
kernel's parameters as Triton binds them, its kernel converted from the function's own source file
(so that every diagnostic points at the user's file:line) with the module-level names it uses as
this program binds them (`_globals`), and handed to the handler, which runs it in the engine. Outside any handler, launches go to Triton as usual.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import textwrap
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from . import _native
from ._globals import kernel_globals
from ._memory import Storages, is_tensor

# Keyword arguments of a launch that are compilation options, not kernel parameters.
_LAUNCH_OPTIONS = {
    "num_warps",
    "num_stages",
    "num_ctas",
    "maxnreg",
    "enable_fp_fusion",
    "launch_cooperative_grid",
    "launch_pdl",
    "ir_override",
    "debug",
    "sanitize_overflow",
    "warmup",
    "grid",
    "stream",
    "device",
    "instrumentation_mode",
    "fpsan_homomorphic_casts",
}

_state = threading.local()
_source_cache: dict[str, tuple[float, str]] = {}
_kernel_cache: dict[Any, Any] = {}  # by `_Conversion`


@dataclass
class LaunchCall:
    """One intercepted launch, bound and converted."""

    kernel: Any  # _native.Kernel
    name: str  # the kernel's name
    grid: tuple[int, int, int]
    ptr_args: list[tuple[str, int, int]]
    scalars: list[tuple[str, Any]]
    storages: Storages
    written: set[int]  # indices of storages the kernel writes
    args: dict[str, Any]  # the bound arguments, by parameter name
    # Runs the launch on Triton itself, as the user's code called it (`backend="triton"`).
    on_triton: Callable[[], Any] | None = None
    # What the kernel was converted from (`promoted_guess` gives the ground truth's kernel).
    conversion: Any = None  # _Conversion

    def describe(self) -> str:
        g = ", ".join(str(x) for x in self.grid)
        return f"launch `{self.name}`[{g}]"

    def run(
        self,
        *,
        poison: bool = False,
        record: bool = False,
        exact: bool = False,
        promote: bool = False,
        notes: tuple[str, int] | None = None,
        snapshot: bool = False,
    ) -> Any:
        """Runs the launch in place. `poison`: masked-off lanes of loads without `other` read NaN
        (by default 0, as on Triton's GPU backends). `record`: who wrote each element (the
        record's writers, for blame). `exact`: the first error in program order is the one
        raised (as with `record`). `notes`: (pass, step) to note what the
        launch relies on (the record's `notes()`). `snapshot`: the record keeps the launch's
        memory before and after, for `_native.Pass` (blame's data-flow slices). Under
        `observing`, every launch is snapshotted and handed to the observer."""
        observer = getattr(_state, "observer", None)
        snapshot |= observer is not None
        record |= snapshot
        executor = current_executor()
        in_place = self.storages.in_place(executor, promote)
        widened = None if in_place or not promote else self.storages.widened(executor)
        in_place |= widened is not None
        if in_place:
            # Work queued on other streams is done before the engine's launch reads the memory.
            _sync()
        # A check's launch in the kernels' dtypes on the GPU: the f64 forms of the kernel the
        # ground truth will launch compile meanwhile.
        ahead = notes is not None and not promote and executor is not None and executor.on_gpu and self.conversion is not None
        rec = _native.launch(
            self.kernel,
            self.grid,
            self.ptr_args,
            self.scalars,
            self.storages.specs(in_place, widened),
            poison=poison,
            record=record,
            exact=exact,
            promote=promote,
            executor=executor,
            notes=None if notes is None else (notes[0], notes[1], self.describe()),
            snapshot=snapshot,
            device=in_place,
            f64_kernel=self.conversion.promoted_guess() if ahead else None,
        )
        if widened is not None:
            self.storages.narrow_back(widened, self.written)
        elif not in_place:
            self.storages.write_back(self.written)
        if observer is not None:
            observer(self, rec)
        return rec


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _handler() -> Callable[[LaunchCall], Any] | None:
    return getattr(_state, "handler", None)


def launches() -> int:
    """How many Triton launches this thread has made since `install()`: every `JITFunction.run`
    that is not a warmup, whether a handler ran it or Triton did (`watch` tells by it which
    Functions launch kernels)."""
    return getattr(_state, "launches", 0)


def current_executor() -> Any:
    """The `_native.Executor` launches in this thread run on (None: the CPU reference)."""
    return getattr(_state, "executor", None)


@contextlib.contextmanager
def using_backend(backend: str, ground: str = "auto", max_programs: int | None = None, *, checks: bool = False):
    """Runs the launches of this thread on `backend` ("cpu", "gpu", "auto", "compare", which
    runs each on both and records differences, or "triton": the GPU, each launch also run on
    Triton itself, see `runs_on_triton`) while the block runs; yields the executor, whose
    `describe()` says where they ran. "gpu" raises `UsageError` saying why when no GPU is usable.
    `ground="kernels"`: the ground truth's VJPs run there too, as VJP kernels (the CLI's
    `--ground kernels`); `"evaluator"`: the CPU evaluator computes them; `"auto"` (the default):
    VJP kernels where the launches run on the GPU, else the evaluator."""
    if backend == "triton" and not checks:
        raise _native.UsageError('backend="triton" is for checks (check_backward, check_function): elsewhere launches run on Triton without tilegrad')
    prev = current_executor(), runs_on_triton()
    _state.executor = _native.Executor("gpu" if backend == "triton" else backend, ground, max_programs)
    _state.triton = backend == "triton"
    try:
        yield _state.executor
    finally:
        _state.executor, _state.triton = prev


def runs_on_triton() -> bool:
    """Whether this thread's checks run the user's launches on Triton itself (`backend="triton"`):
    tilegrad's own GPU backend then runs each beside it, for the ground truth and to cross-check
    its reading of the kernel (`_triton_backend`)."""
    return getattr(_state, "triton", False)


def thread_state() -> tuple[Any, Any]:
    """This thread's launch handler and executor, for work another thread does on its behalf."""
    return _handler(), current_executor()


@contextlib.contextmanager
def with_thread_state(state: tuple[Any, Any]):
    """Runs the block with the launch handler and executor of `thread_state()`."""
    prev = thread_state()
    _state.handler, _state.executor = state
    try:
        yield
    finally:
        _state.handler, _state.executor = prev


@contextlib.contextmanager
def intercepting(handler: Callable[[LaunchCall], Any]):
    """Routes every Triton launch in this thread to `handler` while the block runs."""
    install()
    prev = _handler()
    _state.handler = handler
    try:
        yield
    finally:
        _state.handler = prev


@contextlib.contextmanager
def observing(observer: Callable[[LaunchCall, Any], None]):
    """Every launch run in this thread while the block runs, whatever its handler, is run with
    a snapshot (`LaunchCall.run(snapshot=True)`) and handed to `observer` with its record."""
    prev = getattr(_state, "observer", None)
    _state.observer = observer
    try:
        yield
    finally:
        _state.observer = prev


def _source(fn: Any) -> tuple[str, str]:
    """(file name, whole source text) of the module defining the jitted function `fn`."""
    path = inspect.getsourcefile(fn)
    if path and os.path.exists(path):
        mtime = os.path.getmtime(path)
        hit = _source_cache.get(path)
        if hit is None or hit[0] != mtime:
            with open(path, encoding="utf-8") as f:
                hit = (mtime, f.read())
            _source_cache[path] = hit
        return path, hit[1]
    # Defined without a file (a notebook cell, exec): the function's own source only.
    return f"<{fn.__name__}>", textwrap.dedent(inspect.getsource(fn))


def _scalar_dtype(v: Any) -> str:
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -(2**31) <= v < 2**31 else "i64"
    return "f32"


def _dtype_text(v: Any) -> str | None:
    """`tl.float16` / `torch.bfloat16` for a Triton or torch dtype object, else None."""
    mod = type(v).__module__
    if mod.startswith("torch") and type(v).__name__ == "dtype":
        return str(v)
    if mod.startswith("triton") and type(v).__name__ == "dtype" and hasattr(v, "name"):
        # Triton names its dtypes `fp16`, `bf16`, `fp8e5`, `int32`...
        n = str(v.name)
        n = "bfloat" + n[2:] if n.startswith("bf") else "float" + n[2:] if n.startswith("fp") else n
        return f"tl.{n}"
    return None


def _constexpr_value(name: str, v: Any) -> tuple[str, Any]:
    """(kind, value) of a constexpr as the engine binds it: int, float, bool, str, None, dtype."""
    if hasattr(v, "value") and type(v).__name__ == "constexpr":
        v = v.value
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, float):
        return ("float", v)
    if isinstance(v, str):
        return ("str", v)
    if v is None:
        return ("none", None)
    d = _dtype_text(v)
    if d is not None:
        return ("dtype", d)
    raise _native.UsageError(
        f"constexpr `{name}` = {v!r}: tilegrad binds int, float, bool, str, None and dtype constexprs "
        f"(not {type(v).__name__})"
    )


def _is_descriptor(v: Any) -> bool:
    """A host-built `triton.tools.tensor_descriptor.TensorDescriptor`."""
    return type(v).__name__ == "TensorDescriptor" and all(hasattr(v, a) for a in ("base", "shape", "strides", "block_shape"))


def bind(jit: Any, args: tuple, kwargs: dict, grid: Any) -> LaunchCall:
    """Binds a launch of the JITFunction `jit` as Triton does and converts its kernel."""
    fn = jit.fn
    params = list(jit.params)
    names = [p.name for p in params]
    if len(args) > len(names):
        raise _native.UsageError(f"kernel `{fn.__name__}` takes {len(names)} arguments, the launch passes {len(args)}")
    bound: dict[str, Any] = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in names:
            if k in bound:
                raise _native.UsageError(f"kernel `{fn.__name__}`: argument `{k}` given twice")
            bound[k] = v
        elif k not in _LAUNCH_OPTIONS:
            raise _native.UsageError(f"kernel `{fn.__name__}` has no parameter `{k}` (parameters: {', '.join(names)})")
    for p in params:
        if p.name not in bound:
            default = p._param.default
            if default is inspect.Parameter.empty:
                raise _native.UsageError(f"kernel `{fn.__name__}`: missing argument `{p.name}`")
            bound[p.name] = default

    g = grid(dict(bound)) if callable(grid) else grid
    if isinstance(g, int):
        g = (g,)
    g = tuple(int(x) for x in g)
    if not 1 <= len(g) <= 3:
        raise _native.UsageError(f"kernel `{fn.__name__}`: a grid has 1 to 3 axes, got {g}")
    g = g + (1,) * (3 - len(g))
    if any(x < 1 for x in g):
        raise _native.UsageError(f"kernel `{fn.__name__}`: grid {g} has an empty axis")

    storages = Storages()
    constexprs, ptr_dtypes, scalar_dtypes, descriptors = [], [], [], []
    ptr_args, scalars = [], []
    for p in params:
        v = bound[p.name]
        if p.is_constexpr:
            constexprs.append((p.name, *_constexpr_value(p.name, v)))
        elif _is_descriptor(v):
            # `TensorDescriptor.from_tensor(t, block_shape)`: the tensor, and its shape and
            # strides as hidden scalar parameters of the converted kernel.
            i, off = storages.add(p.name, v.base)
            ptr_args.append((p.name, i, off))
            ptr_dtypes.append((p.name, storages.items[i].dtype))
            descriptors.append((p.name, storages.items[i].dtype, [int(b) for b in v.block_shape]))
            for d, (size, stride) in enumerate(zip(v.shape, v.strides)):
                for kind, x in (("shape", size), ("stride", stride)):
                    scalar_dtypes.append((f"{p.name}__{kind}{d}", "i64"))
                    scalars.append((f"{p.name}__{kind}{d}", int(x)))
        elif is_tensor(v):
            i, off = storages.add(p.name, v)
            ptr_args.append((p.name, i, off))
            ptr_dtypes.append((p.name, storages.items[i].dtype))
        elif isinstance(v, (bool, int, float)):
            scalar_dtypes.append((p.name, _scalar_dtype(v)))
            scalars.append((p.name, v))
        elif v is None:
            # Triton specializes an argument passed as None (an optional bias pointer) as a
            # constexpr None: `if B is not None:` folds away.
            constexprs.append((p.name, "none", None))
        else:
            raise _native.UsageError(
                f"kernel `{fn.__name__}`: argument `{p.name}` of type {type(v).__name__} is not supported "
                "(tensors, arrays, bool, int and float are)"
            )
    file, src = _source(fn)
    # The ground truth's handlers run on f64 promotions of the user's tensors.
    promoted = bool(getattr(_handler(), "promoted", False))
    conv = _Conversion(
        file,
        src,
        fn.__name__,
        tuple(constexprs),
        tuple(ptr_dtypes),
        tuple(scalar_dtypes),
        tuple((n, d, tuple(b)) for n, d, b in descriptors),
        promoted,
        # What the module-level names the kernel uses are here, over the converter's reading.
        tuple(kernel_globals(fn, file)),
    )
    kernel = conv.kernel()
    written_params = set(kernel.written())
    written = {i for (n, i, _) in ptr_args if n in written_params}
    return LaunchCall(kernel, fn.__name__, g, ptr_args, scalars, storages, written, bound, conversion=conv)


_FLOATS = ("f16", "bf16", "f32")


@dataclass(frozen=True)
class _Conversion:
    """What a kernel's conversion depends on (the key of the converted kernels' cache)."""

    file: str
    src: str
    name: str
    constexprs: tuple
    ptr_dtypes: tuple
    scalar_dtypes: tuple
    descriptors: tuple  # (name, dtype, block shape)
    promoted: bool
    bindings: tuple

    def kernel(self) -> Any:
        """The kernel converted, once for each key."""
        kernel = _kernel_cache.get(self)
        if kernel is None:
            descriptors = [(n, d, list(b)) for n, d, b in self.descriptors]
            kernel = _native.convert(
                self.src,
                self.file,
                self.name,
                list(self.constexprs),
                list(self.ptr_dtypes),
                list(self.scalar_dtypes),
                descriptors,
                self.promoted,
                *_program_facts(),
                globals=list(self.bindings),
            )
            _kernel_cache[self] = kernel
        return kernel

    def promoted_guess(self) -> Any:
        """The kernel of this launch in the kernels' dtypes as the ground truth's run will
        convert it: its float tensors f64 (the check's f64 copies), converted `promoted`. The
        GPU compiles its f64 forms (and a forward's VJP kernel) while the launch in the kernels'
        dtypes runs, so that the ground truth's launches and the backward's f64 replay find them
        compiled rather than each waiting for its own compile (at 16384x4096, 1 to 2.5 s a
        kernel). A guess: where host code picks other arguments for f64 tensors (a block size
        from the element size), the truth converts another kernel, and this one was compiled
        for nothing. None where the conversion fails (the truth's own launch reports it)."""
        if self.promoted:
            return self.kernel()
        try:
            return self.promoted_guess_key().kernel()
        except Exception:  # noqa: BLE001 - a guess that fails costs compiles, never the check
            return None

    def promoted_guess_key(self) -> _Conversion:
        """The key of `promoted_guess`: float tensors f64, converted `promoted`."""

        def f64(d: str) -> str:
            return "f64" if d in _FLOATS else d

        ptrs = tuple((n, f64(d)) for n, d in self.ptr_dtypes)
        descriptors = tuple((n, f64(d), b) for n, d, b in self.descriptors)
        return replace(self, ptr_dtypes=ptrs, descriptors=descriptors, promoted=True)


def _program_facts() -> tuple[str, list[tuple[str, str]], tuple[int, int] | None]:
    """What module-level checks of a kernel's files see in this program: the Triton version, the
    environment and the CUDA device's capability (None without one: the converter's default)."""

    import triton

    device = None
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            device = (int(major), int(minor))
    except Exception:  # noqa: BLE001 - no usable CUDA: keep the default
        device = None
    return str(triton.__version__), sorted(os.environ.items()), device


_installed = False
_original: dict[str, Any] = {}
# Which autotune config a launch through `@triton.autotune` uses (index into its configs); with
# `autotune_wrap`, an index past a kernel's configs wraps around (checks of every config).
autotune_config = 0
autotune_wrap = False
# The most configs any `@triton.autotune` kernel launched so far has.
autotune_seen = 0


def install() -> None:
    """Wraps Triton's `run` methods (once); the wrappers defer to Triton outside any handler."""
    global _installed
    if _installed:
        return
    from triton.runtime import autotuner, jit

    _original["jit"] = jit.JITFunction.run
    _original["autotune"] = autotuner.Autotuner.run

    def jit_run(self, *args, grid, warmup, **kwargs):
        if not warmup:
            _state.launches = launches() + 1
        h = _handler()
        if h is None:
            return _original["jit"](self, *args, grid=grid, warmup=warmup, **kwargs)
        if warmup:
            return None
        call = bind(self, args, kwargs, grid)
        call.on_triton = lambda: _original["jit"](self, *args, grid=grid, warmup=False, **kwargs)
        return h(call)

    def autotune_run(self, *args, **kwargs):
        if _handler() is None:
            return _original["autotune"](self, *args, **kwargs)
        global autotune_seen
        configs = self.configs
        autotune_seen = max(autotune_seen, len(configs))
        index = autotune_config % len(configs) if autotune_wrap and configs else autotune_config
        if not 0 <= index < len(configs):
            raise _native.UsageError(f"autotune config {index} of {len(configs)}")
        config = configs[index]
        nargs = dict(zip(self.arg_names, args))
        if config.pre_hook is not None:
            config.pre_hook({**nargs, **kwargs, **config.all_kwargs()})
        return self.fn.run(*args, **kwargs, **config.all_kwargs())

    jit.JITFunction.run = jit_run
    autotuner.Autotuner.run = autotune_run
    _installed = True

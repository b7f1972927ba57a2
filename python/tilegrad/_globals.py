"""Module-level names of a kernel's files as the running program binds them.

From the command line, tilegrad reads a kernel module's top level itself and may have to guess a
condition (`if some_check(): helper = _a else: helper = _b`). Here the module has been imported:
for each module-level name the kernel (and each jit helper it reaches, in its own module) refers
to, its globals say what the name is. The converter takes these over its own reading:

- a `triton.jit` function (or an autotune/heuristics wrapper of one): the file, name and first line
  of the function it wraps (`("jit", (file, name, line))`);
- a `triton.language` function or module (`tl.cast`, `libdevice.exp`, `libdevice`): its dotted
  path (`("builtin", "triton.language.cast")`);
- an int, float, bool or str (or a `tl.constexpr` of one), or a dtype: its value;
- anything else: nothing (the converter keeps its own reading).
"""

from __future__ import annotations

import inspect
import os
from types import CodeType, ModuleType
from typing import Any

# (file, name, kind, value), as `_native.convert` takes them.
Binding = tuple[str, str, str, Any]

# How many wrappers (autotune over heuristics over jit) are looked through.
_MAX_WRAPPERS = 8


def kernel_globals(fn: Any, file: str) -> list[Binding]:
    """What the module-level names that the function `fn` (of the file `file`) and the jit
    helpers it reaches refer to are in this program."""
    out: list[Binding] = []
    seen: set[tuple[str, str, int]] = set()
    stack = [(fn, file)]
    while stack:
        f, f_file = stack.pop()
        key = (f_file, f.__name__, f.__code__.co_firstlineno)
        if key in seen:
            continue
        seen.add(key)
        names = sorted(_code_names(f.__code__))
        for n in names:
            if n not in f.__globals__:
                continue
            v = f.__globals__[n]
            _describe(f_file, n, v, out, stack)
            m_file = _user_module_file(v)
            if m_file is not None:
                # `utils.helper`: the attributes of a source module the kernel reads.
                attrs = vars(v)
                for a in names:
                    if a in attrs:
                        _describe(m_file, a, attrs[a], out, stack)
    return out


def _code_names(code: CodeType) -> set[str]:
    """The global and attribute names a function's code (and the code nested in it) uses."""
    names: set[str] = set()
    todo = [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, CodeType))
    return names


def _describe(file: str, name: str, v: Any, out: list[Binding], stack: list) -> None:
    """Appends what `v`, bound to `name` in the module of `file`, is (if the converter can take
    it); a jit function's own function goes on `stack`, to describe its globals too."""
    path = _builtin_path(v)
    if path is not None:
        out.append((file, name, "builtin", path))
        return
    jit = _jit_function(v)
    if jit is not None:
        f = jit.fn
        f_file = _source_file(f)
        if f_file is not None:
            out.append((file, name, "jit", (f_file, f.__name__, f.__code__.co_firstlineno)))
            stack.append((f, f_file))
        return
    const = _constant(v)
    if const is not None:
        out.append((file, name, *const))


def _builtin_path(v: Any) -> str | None:
    """`triton.language.cast` for `tl.cast`, `triton.language.extra.libdevice.exp` for a
    libdevice function, the module's name for `triton` and its `triton.language` modules."""
    if isinstance(v, ModuleType):
        n = v.__name__
        return n if n == "triton" or n == "triton.language" or n.startswith("triton.language.") else None
    mod = getattr(v, "__module__", None)
    name = getattr(v, "__name__", None)
    if not callable(v) or not isinstance(mod, str) or not isinstance(name, str) or not mod.startswith("triton.language"):
        return None
    import triton.language as tl

    if getattr(tl, name, None) is v:
        return f"triton.language.{name}"
    return f"{mod}.{name}"


def _jit_function(v: Any) -> Any:
    """The `JITFunction` that `v` is or wraps (autotune, heuristics), else None."""
    from triton.runtime.jit import JITFunction, KernelInterface

    for _ in range(_MAX_WRAPPERS):
        if isinstance(v, JITFunction):
            return v
        if not isinstance(v, KernelInterface) or not hasattr(v, "fn"):
            return None
        v = v.fn
    return None


def _constant(v: Any) -> tuple[str, Any] | None:
    """(kind, value) of a plain constant, a `tl.constexpr` of one, or a dtype; else None."""
    if type(v).__name__ == "constexpr" and hasattr(v, "value"):
        v = v.value
    if type(v) is bool:
        return ("bool", v)
    if type(v) is int:
        return ("int", v) if -(2**63) <= v < 2**63 else None
    if type(v) is float:
        return ("float", v)
    if type(v) is str:
        return ("str", v)
    from ._intercept import _dtype_text

    d = _dtype_text(v)
    return None if d is None else ("dtype", d)


def _source_file(f: Any) -> str | None:
    """The source file defining the function `f`, where there is one."""
    try:
        path = inspect.getsourcefile(f)
    except TypeError:
        return None
    return path if path and os.path.exists(path) else None


def _user_module_file(v: Any) -> str | None:
    """The source file of a module that is neither Triton's nor Python's own (the converter reads
    such a module's source when a kernel names `module.helper`)."""
    if not isinstance(v, ModuleType):
        return None
    if v.__name__.split(".")[0] in ("triton", "torch", "numpy", "builtins", "math", "os", "sys"):
        return None
    path = getattr(v, "__file__", None)
    return path if isinstance(path, str) and path.endswith(".py") and os.path.exists(path) else None

"""What `tilegrad.watch` found: one record per call it checked, what it skipped, and the summary
table printed when the watch ends."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._report import Report


class WatchWarning(UserWarning):
    """Under `watch(on_fail="warn")`: a Function's backward failed its check, or the check could
    not run."""


@dataclass
class WatchedCall:
    """One call of a Function that `watch` checked (or meant to: `status` says)."""

    function: str  # the Function's class name
    site: str  # `file:line` of the `apply` call in user code
    path: str  # the whole path of that file
    shapes: list[list[int]]  # of the tensor inputs, as the call received them
    dtypes: list[str]
    ordinal: int  # which of the Function's calls that launched kernels (1: the first; `#n` in the table)
    rows: str | None = None  # how `rows=` cut the inputs, where it did
    report: Report | None = None
    error: str | None = None  # why the check could not run
    seconds: float = 0.0
    done: bool = False  # the check ran (or failed to); else no backward reached the call

    @property
    def status(self) -> str:
        """`"pass"`, `"FAIL"`, `"error"` (the check could not run) or `"no backward"`."""
        if not self.done:
            return "no backward"
        if self.error is not None:
            return "error"
        return "pass" if self.report is not None and self.report.passed else "FAIL"

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class FunctionStats:
    """What `watch` knows of one Function class."""

    name: str
    launches: bool | None = None  # whether its forward launches Triton kernels (None: not seen yet)
    calls: int = 0  # calls that launched kernels
    scheduled: int = 0  # calls whose check was set up
    seconds: float = 0.0  # spent in its checks
    skipped: dict[str, int] = field(default_factory=dict)  # why calls were not checked: how many


def summary(records: list[WatchedCall], stats: list[FunctionStats], calls: int) -> str:
    """The table of `records`, then failures, checks that could not run and skipped calls."""
    launching = [s for s in stats if s.launches]
    if not launching:
        return "tilegrad.watch: no Function launching Triton kernels was called\n"
    done = [r for r in records if r.done]
    failed = [r for r in done if r.status != "pass"]
    total = sum(s.calls for s in launching)
    head = f"tilegrad.watch: {len(launching)} Function{_s(len(launching))} launching Triton kernels, {len(done)} of {total} call{_s(total)} checked"
    head += f": {len(failed)} not passing\n" if failed else ", all passing\n" if done else "\n"
    lines = [head]
    if records:
        lines.append(_table(records))
    lines += _details(records)
    lines += _not_checked(launching, calls)
    return "".join(lines)


_COLUMNS = ("Function", "call site", "inputs", "formula", "rounding", "verdict")


def _table(records: list[WatchedCall]) -> str:
    rows = [list(_COLUMNS)] + [_row(r) for r in records]
    widths = [max(len(row[k]) for row in rows) for k in range(len(_COLUMNS))]
    return "".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in rows)


def _row(r: WatchedCall) -> list[str]:
    name = r.function if r.ordinal == 1 else f"{r.function} #{r.ordinal}"
    formula, rounding = _figures(r.report)
    verdict = {"pass": "ok"}.get(r.status, r.status)
    return [name, r.site, _inputs(r.shapes, r.dtypes), formula, rounding, verdict]


def _inputs(shapes: list[list[int]], dtypes: list[str]) -> str:
    """`[2,8,32] [32] f32` where the tensors share a dtype, else `[16,48]f32 [16]i64`."""
    texts = ["[" + ",".join(str(n) for n in s) + "]" for s in shapes]
    if not texts:
        return "-"
    if len(set(dtypes)) == 1:
        return " ".join(texts) + " " + dtypes[0]
    return " ".join(t + d for t, d in zip(texts, dtypes))


def _figures(report: Report | None) -> tuple[str, str]:
    """The report's worst formula error (the exact replay's, relative to the gradient's scale;
    WRONG where over its limit) and rounding (units of roundoff of the gradient's dtype; `> b`
    where over its budget b) over its gradients."""
    if report is None:
        return "-", "-"
    grads = report.to_dict()["gradients"]
    formula = [g for g in grads if g.get("formula_error") is not None]
    rounding = [g for g in grads if g.get("rounding_units") is not None]
    f, r = "-", "-"
    if formula:
        g = max(formula, key=lambda g: (g.get("formula_passed") is False, g["formula_error"]))
        f = _sci(g["formula_error"]) + (" WRONG" if g.get("formula_passed") is False else "")
    if rounding:
        g = max(rounding, key=lambda g: (g.get("rounding_passed") is False, g["rounding_units"]))
        units = g["rounding_units"]
        r = (f"{units:.2g}" if units < 100 else _sci(units)) + " u"
        r += f" > {g['rounding_budget']:g}" if g.get("rounding_passed") is False else ""
    return f, r


def _sci(x: float) -> str:
    """`x` in two digits, as the reports write figures: 8.2e-8, 1.0e0."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _details(records: list[WatchedCall]) -> list[str]:
    lines = []
    for r in records:
        where = f"{r.function} at {r.site}"
        if r.rows is not None:
            lines.append(f"  {where}: checked on {r.rows}\n")
        if r.status == "FAIL":
            assert r.report is not None
            lines.append(f"  {where}: {r.report.summary()}\n")
        elif r.status == "error":
            lines.append(f"  {where}: the check could not run: {r.error}\n")
        elif r.status == "no backward":
            lines.append(f"  {where}: not checked: no backward reached this call\n")
    return lines


def _not_checked(stats: list[FunctionStats], calls: int) -> list[str]:
    lines = []
    for s in stats:
        for why, n in s.skipped.items():
            lines.append(f"  {s.name}: {n} call{_s(n)} not checked: {why}\n")
    beyond = [(s.name, s.calls - s.scheduled - sum(s.skipped.values())) for s in stats]
    beyond = [(name, n) for name, n in beyond if n > 0]
    if beyond:
        lines.append(f"  calls past the first {calls}, not checked: " + ", ".join(f"{name} {n}" for name, n in beyond) + "\n")
    return lines


def _s(n: int) -> str:
    return "" if n == 1 else "s"


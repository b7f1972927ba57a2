"""The report of a check: the CLI's table and JSON."""

from __future__ import annotations

import json
from typing import Any

from . import _native


class NonFiniteError(_native.UsageError):
    """An input, the ground truth's forward or its gradient is NaN or infinite: against a
    non-finite ground truth a check cannot tell a right backward from a wrong one (pass
    `allow_non_finite=True` to check anyway)."""


def non_finite(what: str, value: float, index: list[int], why: str) -> NonFiniteError:
    v = "NaN" if value != value else repr(value)
    return NonFiniteError(
        f"{what} is {v} at {index}: {why}; a check against a non-finite ground truth cannot tell a right backward "
        "from a wrong one (allow it with `allow_non_finite=True`)"
    )


class Report:
    """The outcome of a check.

    `passed` is True when every forward output and gradient is within tolerance and the backward
    ran cleanly; `str(report)` is the CLI's table; `to_dict()` the CLI's `--json` data.
    """

    def __init__(self, native: Any, triton: list[dict] | None = None, strict: bool = False) -> None:
        self._native = native
        self._triton = triton
        self._strict = strict

    @property
    def passed(self) -> bool:
        return self._native.passed and not (self._strict and self._triton)

    @property
    def triton_differences(self) -> list[dict] | None:
        """With `backend="triton"`: the launches whose results on Triton differ from tilegrad's
        reading of the kernel beyond rounding (`_triton_backend`), each with `where`, `launch`,
        `tensor`, `elements` (of `of`), the first such `element` (flat) and its `triton` and
        `tilegrad` values: findings about the semantics, failures only where the check was
        strict. None for other backends."""
        return self._triton

    @property
    def notes(self) -> list[dict]:
        """What the kernels rely on that Triton does not promise, though its GPU backends do it
        (masked-off lanes read as 0; programs storing the same value to one element), as the
        JSON's `notes`: not failures unless the check was strict."""
        return self.to_dict().get("notes", [])

    def renamed(self, name: str) -> "Report":
        """The same report under another name."""
        return Report(self._native.renamed(name), self._triton, self._strict)

    def to_dict(self) -> dict:
        d = json.loads(self._native.to_json())
        if self._triton is not None:
            d["triton_differences"] = self._triton
            d["passed"] = self.passed
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict()) if self._triton is not None else self._native.to_json()

    def error_map(self, name: str | None = None) -> Any:
        """Where the elements over tolerance are, per failing tensor, as the JSON's `error_map`:
        `summary` (the pattern in one line, e.g. "columns 256..299 of every row"), `cells` (per
        row bin, per column bin, the fraction over tolerance), `row_bins` and `col_bins` (each
        `[start, end)`), `nan_cells`, `over`, `rows`, `cols`, `slices`, `folded_axes`.

        With `name` (a differentiable input, a gradient tensor or a forward output): that
        tensor's map, or None when none of its elements is over tolerance (KeyError when the
        report has no such tensor). Without: `{name: map}` of every tensor that has one,
        gradients (by input name) before forward outputs."""
        d = self.to_dict()
        rows = d["gradients"] + d["forward"]
        if name is None:
            maps: dict[str, Any] = {}
            for r in rows:
                if r.get("error_map") is not None:
                    maps.setdefault(r["name"], r["error_map"])
            return maps
        for r in rows:
            if name in (r["name"], r["tensor"]):
                return r.get("error_map")
        raise KeyError(f"the report compares no tensor named {name!r}")

    def to_html(self, path: Any) -> Any:
        """Writes the report as one self-contained HTML page (a heatmap of where each failing
        tensor is wrong, its worst element's blame, the text report) to `path`; returns it."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._native.to_html())
        return path

    def summary(self) -> str:
        """The verdict in one line: `tilegrad: grad_w of MyFunction FAILS: 300/300 over tolerance,
        worst [187]: expected 1.25, got 2.5 (written at rms_norm.py:41, kernel `rms_norm_bwd`)`;
        the first line of a failing check's `AssertionError`."""
        if self._native.passed and not self.passed and self._triton:
            from ._triton_backend import describe

            return f"tilegrad: {self.to_dict()['name']} FAILS (strict): Triton differs from tilegrad's reading: {describe(self._triton[0])}"
        return summary(self.to_dict())

    def assert_passes(self) -> None:
        """Raises AssertionError when the check failed: its first line is `summary()`, then the
        table."""
        __tracebackhide__ = True
        if not self.passed:
            raise AssertionError(self.summary() + "\n" + str(self))

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        text = str(self._native)
        if self._triton is None:
            return text
        from ._triton_backend import describe

        text = text.replace("\nbackend: ", "\nbackend: triton; each launch also run by tilegrad on ", 1)
        if not self._triton:
            return text.rstrip("\n") + "\nTriton: every launch also ran on Triton; its results agree with tilegrad's reading within rounding.\n"
        lines = [f"Triton: {len(self._triton)} launch result(s) differ from tilegrad's reading of the kernel beyond rounding"]
        lines.append("(a finding about the semantics: the ground truth is tilegrad's reading" + ("; strict: a failure)" if self._strict else ")"))
        lines += ["  " + describe(d) for d in self._triton]
        return text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return f"<tilegrad.Report {'PASS' if self.passed else 'FAIL'}>"


_VALUE_KINDS = ("wrong_value", "non_finite", "never_written", "precision")


def summary(d: dict) -> str:
    """The one-line verdict of a report's JSON data (see `Report.summary`)."""
    name = d["name"]
    if d["passed"]:
        n = len(d["gradients"])
        return f"tilegrad: {name} PASSES ({n} gradient{'' if n == 1 else 's'} within tolerance)"
    findings = d.get("findings") or []
    if not findings:
        return f"tilegrad: {name} FAILS"
    f = findings[0]
    more = f" (and {len(findings) - 1} more finding{'' if len(findings) == 2 else 's'})" if len(findings) > 1 else ""
    rows = d["forward"] if f.get("pass") == "forward" else d["gradients"]
    row = next((r for r in rows if r["tensor"] == f.get("tensor") and r["name"] == f.get("name")), None)
    if f["kind"] not in _VALUE_KINDS or row is None:
        first = (f.get("message") or f["kind"]).splitlines()[0]
        return f"tilegrad: {name} FAILS: {first}{more}"
    what = f"{row['tensor']} of {name}" if f.get("pass") != "forward" else f"output {row['tensor']} of {name}"
    return f"tilegrad: {what} FAILS: {_why(row, f)}{more}"


def _why(row: dict, f: dict) -> str:
    n = 1
    for s in row["shape"]:
        n *= s
    parts = []
    if row["over_tolerance"]:
        parts.append(f"{row['over_tolerance']}/{n} over tolerance")
    elif row.get("formula_passed") is False:
        parts.append("the formula is wrong (exact replay off by %.3g of the scale)" % row["formula_error"])
    elif row.get("rounding_passed") is False:
        parts.append(f"rounding {row['rounding_units']:.1f} u of {row['rounding_of']} (budget {row['rounding_budget']:g} u)")
    elif row.get("calibration"):
        c = row["calibration"]
        parts.append(f"normwise error {_num(c['error'])} over its calibrated limit {_num(c['limit'])}")
    bad = [f"{row[k]} {k.upper() if k == 'nan' else k}" for k in ("nan", "inf") if row.get(k)]
    if bad:
        parts.append(", ".join(bad))
    w = row.get("worst")
    if w:
        parts.append(f"worst {w['index']}: expected {_num(w['expected'])}, got {_num(w['got'])}")
    where = _where(f)
    return ", ".join(parts) + (f" ({where})" if where else "")


def _where(f: dict) -> str:
    if f["kind"] == "never_written":
        return "never written"
    locs = f.get("locations") or []
    if not locs:
        return ""
    loc = locs[0]
    file = loc["file"].replace("\\", "/").rsplit("/", 1)[-1]
    return f"written at {file}:{loc['line']}, kernel `{loc['kernel']}`"


def _num(x: Any) -> str:
    return x if isinstance(x, str) else f"{x:.6g}"

"""Every Triton example of examples/triton/, checked through its Python launcher (an
autograd.Function as kernel libraries write them): the correct backward passes, and each broken
variant fails as the table of broken variants in tests/triton_bwd.rs says: out of bounds or a race
at its line of the backward file, a NaN (an element never written) or a wrong value in a gradient.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import tilegrad  # noqa: E402
from launchers import EXAMPLE_NAMES, broken_variants, correct_bwd, inputs, make  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
# `TILEGRAD_TEST_DEVICE=cuda` runs the same checks on CUDA tensors (copied to the host per launch).
DEVICE = os.environ.get("TILEGRAD_TEST_DEVICE", "cpu")


def expected_outcomes() -> dict[str, str]:
    """`variant -> outcome` from the table in tests/triton_bwd.rs (`OOB at L`, `race at L`, `NaN`, `wrong`),
    and for the variants it does not list, from `CASES` in tests/cases/mod.rs (`Oob(L)`, `Race(L)`,
    `Wrong {..}`, `NanWritten {..}` and `Unwritten {..}`, the last two both `NaN`)."""
    rows = {}
    for line in (ROOT / "tests" / "triton_bwd.rs").read_text().splitlines():
        m = re.match(r"//! \| `(\w+_broken_\w+)` \|.*\| ([^|]+) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    for line in (ROOT / "tests" / "cases" / "mod.rs").read_text().splitlines():
        m = re.match(r'\s*\("(\w+_broken_\w+)", "\w+", "\w+", (Oob|Race|Wrong|NanWritten|Unwritten)\b(?:\((\d+)\))?', line)
        if m and m.group(1) not in rows:
            kind, at = m.group(2), m.group(3)
            rows[m.group(1)] = {"Oob": f"OOB at {at}", "Race": f"race at {at}", "Wrong": "wrong"}.get(kind, "NaN")
    return rows


OUTCOMES = expected_outcomes()
CASES = [(e, b) for e in EXAMPLE_NAMES for b in broken_variants(e)]


def check(example: str, bwd: str | None, seed: int = 0):
    gen = torch.Generator().manual_seed(1234)
    fn = make(example, bwd)
    args = [x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs(example, gen)]
    return tilegrad.check_function(fn, *args, seed=seed)


@pytest.mark.parametrize("example", EXAMPLE_NAMES)
def test_correct_backward_passes(example):
    report = check(example, None)
    report.assert_passes()
    assert report.to_dict()["gradients"], "no gradient compared"
    assert "PASS" in str(report)


def test_every_broken_variant_has_an_expected_outcome():
    assert len(CASES) >= 30
    missing = [b for _, b in CASES if b not in OUTCOMES]
    assert not missing, missing


@pytest.mark.parametrize("example,variant", CASES, ids=[b for _, b in CASES])
def test_broken_variant_fails(example, variant):
    report = check(example, variant)
    text = str(report)
    assert not report.passed, text
    d = report.to_dict()
    outcome = OUTCOMES[variant]
    failure = d["failure"]
    if re.match(r"(OOB|race) at (\d+)", outcome):
        # Out of bounds or a race in the broken kernel. Which of the two depends on the sizes (an
        # access past a row of a 2-D tensor lands in the next row: a race, not out of bounds).
        assert failure is not None, text
        assert "out-of-bounds" in failure["message"] or "race" in failure["message"], failure["message"]
        assert variant in failure["message"] and "_bwd.py:" in failure["message"], failure["message"]
    elif outcome == "NaN":
        assert failure is None, text
        bad = [g for g in d["gradients"] if not g["passed"]]
        assert any(g["nan"] > 0 for g in bad), text
        assert "never written" in text or "written by" in text, text
    else:
        # A wrong value: a gradient over tolerance (or, at these sizes, an access out of bounds).
        bad = [g for g in d["gradients"] if not g["passed"] and (g["over_tolerance"] > 0 or g.get("formula_passed") is False)]
        assert bad or (failure is not None and variant in failure["message"]), text

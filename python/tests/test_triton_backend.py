"""`backend="triton"`: each launch runs on tilegrad's GPU backend, then on Triton itself from the
same memory, Triton's results kept, and a difference beyond rounding reported as a finding about
the semantics. The comparison rule and the run-twice mechanism are tested on the CPU; whole
checks on Triton where a CUDA device is usable."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import functions_liger_style as L  # noqa: E402
import tilegrad  # noqa: E402
from tilegrad import _triton_backend as tb  # noqa: E402
from tilegrad._memory import Storage, Storages  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_rounding_is_not_a_difference_and_other_values_are():
    g = torch.Generator().manual_seed(3)
    ours = torch.randn(1000, generator=g)
    # f32 values a few units of their last place apart: rounding.
    assert tb.differ(ours * (1 + 3e-7), ours, "f32") is None
    assert tb.differ(ours.clone(), ours, "f32") is None
    # One value of another sign, one NaN where tilegrad has a number: two elements over.
    t = ours.clone()
    t[17] = -t[17]
    t[400] = float("nan")
    d = tb.differ(t, ours, "f32")
    assert d is not None and d["elements"] == 2 and d["of"] == 1000 and d["element"] == 17
    assert d["triton"] == pytest.approx(-float(ours[17])) and d["tilegrad"] == pytest.approx(float(ours[17]))
    # Infinities agree only with themselves.
    a, b = ours.clone(), ours.clone()
    a[5] = b[5] = float("inf")
    assert tb.differ(a, b, "f32") is None
    a[5] = float("-inf")
    assert tb.differ(a, b, "f32")["element"] == 5
    # bf16: a unit of the last place is rounding, a tenth of the value is not.
    h = ours.bfloat16()
    up = (h.float() * (1 + 2.0**-8)).bfloat16()
    assert tb.differ(up, h, "bf16") is None
    assert tb.differ((h.float() * 1.1).bfloat16(), h, "bf16")["elements"] > 500
    # Integers: any difference.
    i = torch.arange(10, dtype=torch.int32)
    j = i.clone()
    j[9] = 0
    assert tb.differ(i, i.clone(), "i32") is None and tb.differ(j, i, "i32")["element"] == 9


class _Call:
    """A launch writing one CPU storage, standing in for `LaunchCall` (whose storages are CUDA)."""

    def __init__(self, flat: torch.Tensor, triton) -> None:
        self.storages = Storages()
        self.storages.items.append(Storage(key=("t",), dtype="f32", addr=0, numel=flat.numel(), names=["out_ptr"], device_flat=flat))
        self.written = {0}
        self.on_triton = triton

    def describe(self) -> str:
        return "launch `k`[4, 1, 1]"


def test_triton_runs_from_the_memory_tilegrad_ran_from_and_its_results_stay():
    out = torch.arange(8, dtype=torch.float32)
    seen = []

    def triton_run():
        seen.append(out.clone())
        out.add_(1.0)

    def ours():
        out.add_(1.0)
        return "record"

    differences: list[dict] = []
    assert tb.run_both(_Call(out, triton_run), ours, "forward step 0", differences) == "record"
    # Triton started from the initial contents, not from tilegrad's results.
    assert torch.equal(seen[0], torch.arange(8, dtype=torch.float32))
    assert torch.equal(out, torch.arange(8, dtype=torch.float32) + 1) and differences == []

    def triton_other():
        out.mul_(-1.0)

    tb.run_both(_Call(out, triton_other), ours, "backward step 3", differences)
    # Triton's results stay; the difference names where, which launch and tensor, and an element.
    assert torch.equal(out, -(torch.arange(8, dtype=torch.float32) + 1))
    (d,) = differences
    assert (d["where"], d["launch"], d["tensor"], d["elements"], d["of"]) == ("backward step 3", "launch `k`[4, 1, 1]", "out_ptr", 8, 8)
    assert (d["triton"], d["tilegrad"]) == (-1.0, 2.0)
    assert "backward step 3" in tb.describe(d) and "Triton -1.0, tilegrad 2.0" in tb.describe(d)


def test_a_difference_is_a_finding_and_under_strict_a_failure():
    from tilegrad._report import Report

    class Native:
        passed = True

        def to_json(self):
            return '{"name": "f", "passed": true, "gradients": [], "forward": []}'

        def __str__(self):
            return "check `f`: PASS\nbackend: gpu: a GPU\n"

    d = {"where": "forward step 0", "launch": "launch `k`[1, 1, 1]", "tensor": "y", "elements": 3, "of": 8, "element": 2, "triton": 1.0, "tilegrad": 0.0, "rule": "r"}
    lenient, strict = Report(Native(), [d], False), Report(Native(), [d], True)
    assert lenient.passed and not strict.passed and lenient.triton_differences == [d]
    assert "backend: triton; each launch also run by tilegrad on gpu" in str(lenient) and "`y` differs at 3 of 8" in str(lenient)
    assert strict.to_dict()["passed"] is False and strict.to_dict()["triton_differences"] == [d]
    assert "FAILS (strict)" in strict.summary() and "forward step 0" in strict.summary()
    assert Report(Native()).triton_differences is None and "triton_differences" not in Report(Native()).to_dict()


def test_triton_is_a_backend_for_checks_only():
    with pytest.raises(tilegrad.UsageError, match="is for checks"):
        with tilegrad.intercept(backend="triton"):
            pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is usable")
def test_without_a_gpu_triton_is_refused_clearly():
    x = torch.randn(4, 40)
    w = torch.randn(40)
    with pytest.raises(tilegrad.UsageError):
        tilegrad.check_function(L.RMSNorm, x, w, backend="triton")


@cuda
def test_cpu_tensors_are_refused_for_triton():
    with pytest.raises(tilegrad.UsageError, match="CUDA tensors"):
        tilegrad.check_function(L.RMSNorm, torch.randn(4, 40), torch.randn(40), backend="triton")


@cuda
def test_a_library_function_checks_on_triton_alike():
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(37, 300, device="cuda", generator=g)
    w = torch.randn(300, device="cuda", generator=g)
    rep = tilegrad.check_function(L.RMSNorm, x, w, backend="triton")
    assert rep.passed, str(rep)
    assert rep.triton_differences == [] and "agree with tilegrad's reading" in str(rep)
    assert rep.to_dict()["triton_differences"] == []
    on_gpu = tilegrad.check_function(L.RMSNorm, x, w, backend="gpu")
    assert on_gpu.triton_differences is None
    assert [(a["name"], a["passed"]) for a in rep.to_dict()["gradients"]] == [(b["name"], b["passed"]) for b in on_gpu.to_dict()["gradients"]]
    # A wrong backward fails on Triton too, its blame from tilegrad's own run.
    bad = tilegrad.check_function(L.RMSNormNoMean, x, w, backend="triton")
    assert not bad.passed and bad.triton_differences == []

"""`tilegrad.watch`: a model's Functions checked on real training steps, with the cotangents
autograd passes them. Context and model forms, `calls=`, `on_fail=`, the real cotangent (a
backward right only for some cotangents is caught by the trial that has another), in-place
Functions, budgets and skips, no double checks, `Function.apply` restored, training unchanged."""

from __future__ import annotations

import contextlib
import io
import pathlib
import warnings

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import functions_liger_style as L  # noqa: E402
import functions_watch as F  # noqa: E402
import tilegrad  # noqa: E402

APPLY = torch.autograd.Function.__dict__["apply"]


def leaf(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).requires_grad_(True)


def step(fn: type, x: torch.Tensor, w: torch.Tensor | None, loss=lambda y: (y * y).sum()) -> None:
    """One forward and backward of `fn` (on `x` alone where `w` is None), its launches on the
    engine."""
    with tilegrad.intercept():
        loss(fn.apply(x) if w is None else fn.apply(x, w)).backward()


def line_of(text: str) -> int:
    """The line of functions_watch.py that holds `text` (its first)."""
    lines = pathlib.Path(F.__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def quiet(model=None, **options):
    """A watch that logs (warns of nothing) and prints its summary to a buffer (`.file`)."""
    options.setdefault("on_fail", "log")
    return tilegrad.watch(model, file=io.StringIO(), **options)


class Model(torch.nn.Module):
    def __init__(self, fn: type = F.Scale):
        super().__init__()
        self.fn = fn
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 6))

    def forward(self, x):
        return self.fn.apply(x, self.w)


# -- the two forms ------------------------------------------------------------------------------


def test_the_context_checks_each_function_and_prints_its_summary():
    x, w = leaf(4, 6), leaf(6, seed=1)
    with quiet() as watch:
        step(F.Scale, x, w)
    assert torch.autograd.Function.__dict__["apply"] is APPLY
    (call,) = watch.reports
    assert (call.function, call.shapes, call.dtypes, call.status, call.ordinal) == ("Scale", [[4, 6], [6]], ["f32", "f32"], "pass", 1)
    assert call.site.startswith("test_watch.py:") and call.report.passed
    text = watch.file.getvalue()
    assert text == watch.summary()
    lines = text.splitlines()
    assert lines[0] == "tilegrad.watch: 1 Function launching Triton kernels, 1 of 1 call checked, all passing"
    assert lines[1].split() == ["Function", "call", "site", "inputs", "formula", "rounding", "verdict"]
    row = lines[2].split()
    assert row[:5] == ["Scale", call.site, "[4,6]", "[6]", "f32"] and row[-2:] == ["u", "ok"], text  # rounding: units of roundoff
    assert float(row[5]) < 1e-6 and float(row[6]) < 16, text  # the formula's replay error; the rounding within budget


def test_a_model_handle_watches_its_forwards_until_closed():
    model = Model(F.ScaleForOnes)
    x = leaf(4, 6)
    watch = quiet(model)
    assert torch.autograd.Function.__dict__["apply"] is not APPLY
    step(F.ScaleForOnes, x, leaf(6))  # outside the model's forward: not watched
    assert watch.reports == []
    with tilegrad.intercept():
        (model(x) ** 2).sum().backward()
    watch.close()
    assert torch.autograd.Function.__dict__["apply"] is APPLY
    (call,) = watch.reports
    assert call.function == "ScaleForOnes" and call.status == "FAIL"
    with tilegrad.intercept():
        (model(x) ** 2).sum().backward()  # closed: no more checks
    assert len(watch.reports) == 1
    assert "ScaleForOnes" in watch.file.getvalue() and "FAIL" in watch.file.getvalue()


def test_apply_is_restored_whatever_order_watches_and_inlining_end_in():
    # The ground truth's inlining and a watch share one wrapper of `apply`: a watch closed while
    # an inlining is active (another thread's check) leaves nothing installed once both end.
    from tilegrad._functions import inlining

    model = Model()
    watch = quiet(model)
    ctx = inlining()
    ctx.__enter__()
    watch.close()
    assert torch.autograd.Function.__dict__["apply"] is not APPLY
    ctx.__exit__(None, None, None)
    assert torch.autograd.Function.__dict__["apply"] is APPLY


def test_a_model_handle_as_a_context_and_remove():
    model = Model()
    with quiet(model) as watch:
        with tilegrad.intercept():
            model(leaf(3, 6)).sum().backward()
    assert torch.autograd.Function.__dict__["apply"] is APPLY and [c.status for c in watch.reports] == ["pass"]
    other = quiet(model)
    other.remove()
    assert torch.autograd.Function.__dict__["apply"] is APPLY


def test_calls_sets_how_many_calls_of_a_function_are_checked():
    x, w = leaf(4, 6), leaf(6, seed=1)
    with quiet(calls=2) as watch:
        for _ in range(3):
            step(F.Scale, x, w)
    assert [c.ordinal for c in watch.reports] == [1, 2]
    assert [line.split()[:2] for line in watch.summary().splitlines()[2:4]] == [["Scale", watch.reports[0].site], ["Scale", "#2"]]
    assert "  calls past the first 2, not checked: Scale 1\n" in watch.summary()


def test_functions_that_launch_no_kernel_are_not_watched():
    x = leaf(4, 6)
    with quiet() as watch:
        F.TorchOnly.apply(x).sum().backward()
    assert watch.reports == []
    assert watch.summary() == "tilegrad.watch: no Function launching Triton kernels was called\n"


@pytest.mark.parametrize("reentrant", [True, False])
def test_under_checkpointing_the_function_inside_is_checked_not_torchs(reentrant):
    x, w = leaf(4, 6), leaf(6)
    with quiet(calls=3) as watch:
        with tilegrad.intercept():
            y = torch.utils.checkpoint.checkpoint(lambda a, b: F.ScaleForOnes.apply(a, b), x, w, use_reentrant=reentrant)
            (y * y).sum().backward()
    assert [(c.function, c.status) for c in watch.reports] == [("ScaleForOnes", "FAIL")]


# -- on_fail ------------------------------------------------------------------------------------


def test_on_fail_raise_raises_the_verdict_from_the_backward():
    x, w = leaf(4, 6), leaf(6)
    with quiet(on_fail="raise") as watch:
        with pytest.raises(AssertionError) as e:
            step(F.ScaleForOnes, x, w)
    first = str(e.value).splitlines()[0]
    assert first.startswith("tilegrad: grad_x of ScaleForOnes FAILS") and f"functions_watch.py:{line_of('tl.store(DX + row * n_cols + cols, w, mask=mask)')}" in first
    assert watch.reports[0].status == "FAIL"


def test_on_fail_warn_warns_and_log_only_records():
    x, w = leaf(4, 6), leaf(6)
    with quiet(on_fail="warn"):
        with pytest.warns(tilegrad.WatchWarning, match=r"ScaleForOnes FAILS.*\[call at test_watch.py:\d+\]"):
            step(F.ScaleForOnes, x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with quiet(on_fail="log") as watch:
            step(F.ScaleForOnes, x, w)
    assert watch.reports[0].status == "FAIL" and not watch.passed


def test_a_check_that_cannot_run_is_reported_and_training_goes_on():
    x, w = leaf(4, 6), leaf(6)
    with torch.no_grad():
        x[0, 0] = float("inf")
    with quiet(on_fail="warn") as watch:
        with pytest.warns(tilegrad.WatchWarning, match="Scale at test_watch.py:.*: the check could not run: NonFiniteError"):
            step(F.Scale, x, w, loss=lambda y: y[1:].sum())
    (call,) = watch.reports
    assert call.status == "error" and call.error.startswith("NonFiniteError: input `x` is inf")
    assert "the check could not run: NonFiniteError" in watch.summary()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with quiet(on_fail="raise"):
        with pytest.raises(tilegrad.NonFiniteError):
            step(F.Scale, x, w, loss=lambda y: y[1:].sum())


# -- the cotangent training passes --------------------------------------------------------------


def test_a_backward_right_only_for_ones_passes_on_the_real_cotangent_and_fails_a_random_one():
    x, w = leaf(4, 6), leaf(6)
    with quiet(trials=0) as real_only:
        step(F.ScaleForOnes, x, w, loss=lambda y: y.sum())  # the cotangent is ones
    assert real_only.reports[0].status == "pass"
    with quiet(trials=1) as watch:
        step(F.ScaleForOnes, x, w, loss=lambda y: y.sum())
    report = watch.reports[0].report.to_dict()
    assert not report["passed"] and report["trials"] == 2
    assert {g["trial"] for g in report["gradients"] if not g["passed"]} == {1}, report


def test_the_real_cotangent_is_the_first_trial_layout_included():
    x, w = leaf(4, 6), leaf(6)
    assert tilegrad.check_function(F.ScaleForContiguous, x, w).passed  # random cotangents are contiguous
    transposed = lambda y: (y.t() * torch.linspace(-1, 1, 24).reshape(6, 4)).sum()  # noqa: E731 - dy is column-major
    with quiet(trials=0) as watch:
        step(F.ScaleForContiguous, x, w, loss=transposed)
    report = watch.reports[0].report
    assert not report.passed and report.to_dict()["trials"] == 1
    assert f"functions_watch.py:{line_of('tl.store(DX + row * n_cols + cols, dy * w')}" in report.summary(), report.summary()
    with quiet(trials=0) as right:
        step(F.Scale, x, w, loss=transposed)
    assert right.reports[0].status == "pass"


# -- in place -----------------------------------------------------------------------------------


def test_an_in_place_function_is_checked_on_the_input_it_received():
    x = leaf(3, 5)
    F.ExpInPlace.seen.clear()
    with quiet() as watch:
        with tilegrad.intercept():
            h = x * 1.0
            y = F.ExpInPlace.apply(h)
            y.sum().backward()
    assert watch.reports[0].status == "pass"
    received = F.ExpInPlace.seen[0]
    assert len(F.ExpInPlace.seen) > 1 and all(torch.equal(s, received) for s in F.ExpInPlace.seen[1:])
    assert torch.equal(received, x.detach())
    assert torch.allclose(x.grad, x.detach().exp())


def test_autotuned_kernels_are_checked_on_the_config_training_used():
    x = leaf(384)  # 128 divides it, 256 does not
    with quiet() as first:
        step(F.DoubleAutotuned, x, None, loss=lambda y: (y * y).sum())
    assert first.reports[0].status == "pass"
    with quiet() as second, tilegrad.use_autotune_config(1):
        with pytest.raises(tilegrad.LaunchError, match="out-of-bounds"):
            step(F.DoubleAutotuned, x, None, loss=lambda y: (y * y).sum())  # the real backward
    assert second.reports[0].status == "FAIL"
    assert "out-of-bounds access to `gy_ptr`" in second.reports[0].report.summary()


# -- budgets ------------------------------------------------------------------------------------


def test_max_elements_skips_larger_calls_with_a_note():
    with quiet(max_elements=30) as watch:
        step(F.Scale, leaf(8, 6), leaf(6))  # 54 elements
        assert watch.summary().splitlines()[0] == "tilegrad.watch: 1 Function launching Triton kernels, 0 of 1 call checked"
        step(F.Scale, leaf(4, 6), leaf(6))  # 30
    assert [c.shapes for c in watch.reports] == [[[4, 6], [6]]]
    assert "Scale: 1 call not checked: inputs over max_elements=30" in watch.summary()


def test_time_budget_skips_calls_once_a_functions_checks_took_longer():
    with quiet(calls=3, time_budget=1e-6) as watch:
        for _ in range(3):
            step(F.Scale, leaf(4, 6), leaf(6))
    assert len(watch.reports) == 1
    assert "Scale: 2 calls not checked: its checks took" in watch.summary()
    assert "over time_budget=1e-06 s" in watch.summary()


def test_rows_checks_row_independent_functions_on_their_first_rows():
    x, w = leaf(8, 6), leaf(6)
    with quiet(rows=2, row_independent={F.Scale}, trials=0) as watch:
        step(F.ScaleForContiguous, x, w, loss=lambda y: (y.t() * torch.arange(48.0).reshape(6, 8)).sum())
    (call,) = watch.reports
    assert call.shapes == [[2, 6], [6]] and call.rows == "the first 2 of 8 rows of `x` (row_independent)"
    assert "ScaleForContiguous at test_watch.py" in watch.summary() and "checked on the first 2 of 8 rows of `x`" in watch.summary()
    # The real cotangent, cut alike, still has its layout: the broken backward fails on it.
    assert call.status == "FAIL"
    with quiet(rows=2, row_independent=lambda cls: cls is F.Scale) as other:
        step(F.ScaleForContiguous, x, w)
    assert other.reports[0].rows is None and other.reports[0].shapes == [[8, 6], [6]]
    with quiet(rows=2, row_independent=F.Scale, max_elements=20) as cut:  # 54 elements, 18 once cut
        step(F.Scale, x, w)
    assert cut.reports[0].shapes == [[2, 6], [6]] and cut.reports[0].status == "pass"


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(rows=2), "rows= and row_independent= go together"),
        (dict(row_independent={F.Scale}), "rows= and row_independent= go together"),
        (dict(rows=2, row_independent={int}), "is not a torch.autograd.Function subclass"),
        (dict(calls=0), "calls must be an int of at least 1"),
        (dict(trials=-1), "trials must be an int of at least 0"),
        (dict(on_fail="ignore"), "on_fail must be one of 'raise', 'warn', 'log'"),
        (dict(max_elements=0), "max_elements must be an int of at least 1"),
        (dict(time_budget=0), "time_budget: seconds, a number above 0"),
        (dict(file="out.txt"), "file: a text stream with `write`"),
        (dict(seed=-1), "seed must be an int of at least 0"),
        (dict(strict="yes"), "strict: True or False"),
    ],
)
def test_bad_options_raise_clearly(options, error):
    with pytest.raises((ValueError, TypeError), match=error):
        tilegrad.watch(**options)
    with pytest.raises(TypeError, match="watch\\(model\\): a torch.nn.Module, not int"):
        tilegrad.watch(3)
    assert torch.autograd.Function.__dict__["apply"] is APPLY


# -- no double checks, apply restored -----------------------------------------------------------


def test_nested_watches_check_a_call_once():
    model = Model()
    with quiet(calls=5) as outer:
        with quiet(calls=5) as inner:
            step(F.Scale, leaf(4, 6), leaf(6))
        with quiet(model, calls=5) as handle:
            with tilegrad.intercept():
                model(leaf(3, 6)).sum().backward()
        step(F.Scale, leaf(2, 6), leaf(6))
        assert tilegrad.check_function(F.Scale, leaf(5, 6), leaf(6)).passed  # a check's own calls
    assert [c.shapes[0] for c in inner.reports] == [[4, 6]]
    assert [c.shapes[0] for c in handle.reports] == [[3, 6]]
    assert [c.shapes[0] for c in outer.reports] == [[2, 6]]  # not the checker's own calls either
    assert torch.autograd.Function.__dict__["apply"] is APPLY


def test_apply_is_restored_when_the_block_raises_and_a_watch_is_entered_once():
    with pytest.raises(RuntimeError, match="boom"):
        with quiet():
            raise RuntimeError("boom")
    assert torch.autograd.Function.__dict__["apply"] is APPLY
    watch = quiet()
    with watch:
        pass
    with pytest.raises(RuntimeError, match="this watch is closed"):
        with watch:
            pass
    assert torch.autograd.Function.__dict__["apply"] is APPLY


def test_a_call_without_backward_is_reported_as_such():
    with quiet() as watch:
        with tilegrad.intercept():
            F.Scale.apply(leaf(4, 6), leaf(6))
    assert watch.reports[0].status == "no backward"
    assert "not checked: no backward reached this call" in watch.summary()


# -- training is unchanged ----------------------------------------------------------------------


class Liger(torch.nn.Module):
    """Library-style Functions that write in place: RMSNorm's backward overwrites its cotangent,
    cross entropy's forward writes the gradient into its logits; dropout draws from torch."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = torch.nn.Parameter(torch.rand(16, generator=g) + 0.5)
        self.proj = torch.nn.Parameter(torch.randn(16, 10, generator=g) * 0.3)

    def forward(self, x, target):
        h = L.RMSNorm.apply(x, self.w)
        h = torch.nn.functional.dropout(h, 0.2)
        return L.CrossEntropy.apply(h @ self.proj, target)[0]


def train(watched: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = Liger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(6, 16), torch.randint(0, 10, (6,))
    watch = quiet(model, calls=2) if watched else None
    with tilegrad.intercept():
        for _ in range(3):
            opt.zero_grad()
            model(x, target).backward()
            opt.step()
    if watch is not None:
        watch.close()
        assert [(c.function, c.status) for c in watch.reports] == [("RMSNorm", "pass"), ("CrossEntropy", "pass")] * 2, watch.summary()
    return [p.detach().clone() for p in model.parameters()]


def test_a_check_leaves_torchs_random_state_as_it_was():
    def draws(watched: bool) -> torch.Tensor:
        torch.manual_seed(0)
        with quiet() if watched else contextlib.nullcontext():
            step(F.ScaleDrawingSeed, leaf(4, 6), leaf(6))  # the check runs the forward again
        return torch.rand(4)

    assert torch.equal(draws(False), draws(True))


def test_training_is_identical_with_and_without_watch():
    for a, b in zip(train(False), train(True)):
        assert torch.equal(a, b)

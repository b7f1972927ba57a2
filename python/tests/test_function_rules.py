"""PyTorch's rules in checks: the ground truth never runs a custom Function's backward; which
inputs are differentiated (requires_grad, `wrt`, None gradients); `check_function` calls a
Function as `Function.apply` does (inputs requiring grad, keyword arguments, PyTorch's ctx,
outputs marked non-differentiable, materialized cotangents, in-place `grad_output`); gradient
shapes as torch validates them. Library-style Functions (functions_liger_style.py) pass, and
their broken variants fail."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import functions_liger_style as L  # noqa: E402
import functions_watch as FW  # noqa: E402
import kernels as K  # noqa: E402
import tilegrad  # noqa: E402


class _KeywordProbe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k=1.0):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


def _apply_takes_keywords() -> bool:
    """Whether this torch's `Function.apply` accepts keyword arguments (older ones do not)."""
    try:
        _KeywordProbe.apply(torch.ones(1), k=2.0)
        return True
    except TypeError:
        return False


APPLY_TAKES_KEYWORDS = _apply_takes_keywords()


def check_with(fn, *args, **kwargs):
    """`check_function(fn, *args, **kwargs)`, the keywords passed by position where this torch's
    `apply` takes none (as a user of that torch calls it)."""
    if APPLY_TAKES_KEYWORDS:
        return tilegrad.check_function(fn, *args, **kwargs)
    import inspect

    names = list(inspect.signature(fn.forward).parameters)[1 + len(args) :]
    return tilegrad.check_function(fn, *args, *(kwargs[n] for n in names if n in kwargs))


def test_keywords_behave_as_this_torchs_apply():
    x = rand(5)
    if APPLY_TAKES_KEYWORDS:
        assert tilegrad.check_function(_KeywordProbe, x, k=3.0).passed
    else:
        with pytest.raises(TypeError):
            tilegrad.check_function(_KeywordProbe, x, k=3.0)


def rand(*shape, seed=7):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def launch_square(x):
    y = torch.empty_like(x)
    K.square[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y


class SquareTorchWrong(torch.autograd.Function):
    """A Triton forward with a wrong torch backward (the factor 2 is missing)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return launch_square(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return x * g


class SquareTritonWrong(SquareTorchWrong):
    """The same with a wrong Triton backward."""

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gx = torch.empty_like(x)
        K.square_bwd_wrong[(triton.cdiv(x.numel(), 64),)](x, g, gx, x.numel(), BLOCK=64)
        return gx


class SquareOpaque(SquareTorchWrong):
    """A forward autograd cannot follow (computed through numpy)."""

    @staticmethod
    def forward(ctx, x):
        return torch.from_numpy(x.detach().numpy() ** 2)


def right(x, g):
    return (2 * x * g,)


def wrong(x, g):
    return (x * g,)


@pytest.mark.parametrize("fn", [SquareTorchWrong, SquareTritonWrong], ids=["torch backward", "triton backward"])
def test_a_functions_own_backward_is_never_the_ground_truth(fn):
    x = rand(1000)
    report = tilegrad.check_backward(lambda x: fn.apply(x), right, [x])
    assert report.passed, str(report)
    report = tilegrad.check_backward(lambda x: fn.apply(x), wrong, [x])
    assert not report.passed, str(report)
    assert not tilegrad.check_function(fn, x).passed


def test_a_function_the_truth_cannot_differentiate_is_refused_by_name():
    x = rand(300)
    with pytest.raises(tilegrad.UsageError, match="SquareOpaque.forward"):
        tilegrad.check_backward(lambda x: SquareOpaque.apply(x), right, [x])
    apply = SquareTorchWrong.apply  # taken before the check: applies the Function as itself
    with pytest.raises(tilegrad.UsageError, match="SquareTorchWrong"):
        tilegrad.check_backward(lambda x: apply(x), right, [x])


def rope_inputs(rows=19, half=45):
    angles = rand(rows, half, seed=3) * 3
    return rand(rows, 2 * half), angles.cos(), angles.sin()


def test_none_gradients_of_default_inputs_are_not_compared():
    report = tilegrad.check_function(L.Rope, *rope_inputs())
    assert report.passed, str(report)
    d = report.to_dict()
    assert [g["name"] for g in d["gradients"]] == ["q"]
    assert [(n["name"], n["reason"]) for n in d["not_compared"]] == [("cos", "no gradient (None)"), ("sin", "no gradient (None)")]
    assert "no gradient (None)" in str(report)
    broken = tilegrad.check_function(L.RopeForwardRotation, *rope_inputs())
    assert not broken.passed and [g["name"] for g in broken.to_dict()["gradients"] if not g["passed"]] == ["q"]


def test_a_none_gradient_asked_for_is_a_zero_gradient():
    q, cos, sin = rope_inputs()
    for report in (
        tilegrad.check_function(L.Rope, q, cos, sin, wrt=["q", "cos"]),
        tilegrad.check_function(L.Rope, q.requires_grad_(), cos.requires_grad_(), sin),
    ):
        d = report.to_dict()
        assert not report.passed
        assert {g["name"]: g["passed"] for g in d["gradients"]} == {"q": True, "cos": False}, str(report)
        assert "not_compared" not in d


def test_wrt_takes_positions_and_names():
    q, cos, sin = rope_inputs()
    for wrt in (0, "q", [0], ["q"]):
        report = tilegrad.check_function(L.Rope, q, cos, sin, wrt=wrt)
        assert report.passed and [g["name"] for g in report.to_dict()["gradients"]] == ["q"]
    with pytest.raises(ValueError, match="no input named `angle`"):
        tilegrad.check_function(L.Rope, q, cos, sin, wrt=["angle"])
    with pytest.raises(ValueError, match="position 5"):
        tilegrad.check_backward(lambda q, c, s: L.Rope.apply(q, c, s), lambda *a: a[:3], [q, cos, sin], wrt=[5])


def test_kl_targets_get_no_gradient():
    logits = rand(23, 37, seed=11)
    y_pred = torch.log_softmax(logits, -1)
    y_true = torch.softmax(rand(23, 37, seed=12), -1)
    report = tilegrad.check_function(L.KLDiv, y_pred, y_true)
    assert report.passed, str(report)
    assert [n["name"] for n in report.to_dict()["not_compared"]] == ["y_true"]
    assert not tilegrad.check_function(L.KLDivDoubled, y_pred, y_true).passed


def rms_inputs():
    return rand(37, 300, seed=5), 1 + 0.5 * rand(300, seed=6)


@pytest.mark.parametrize("in_place", [True, False])
def test_rms_norm_with_a_host_summed_weight_gradient(in_place):
    x, w = rms_inputs()
    report = check_with(L.RMSNorm, x, w, eps=1e-6, in_place=in_place)
    assert report.passed, str(report)
    assert [g["name"] for g in report.to_dict()["gradients"]] == ["X", "W"]


@pytest.mark.parametrize("fn,bad", [(L.RMSNormScaledDW, ["W"]), (L.RMSNormNoMean, ["X"])])
def test_rms_norm_broken_variants_fail(fn, bad):
    report = tilegrad.check_function(fn, *rms_inputs())
    assert not report.passed
    assert [g["name"] for g in report.to_dict()["gradients"] if not g["passed"]] == bad, str(report)


def test_a_gradient_torch_accepts_is_summed_to_the_input_shape():
    report = tilegrad.check_function(L.RMSNormKeepDim, *rms_inputs())
    assert report.passed, str(report)
    assert report.to_dict()["gradients"][1]["shape"] == [300]


def test_a_gradient_torch_rejects_fails_with_torchs_message():
    x, w = rms_inputs()
    with tilegrad.intercept(), pytest.raises(RuntimeError) as torch_error:
        L.RMSNormBadShape.apply(x.clone().requires_grad_(), w.clone().requires_grad_()).sum().backward()
    report = tilegrad.check_function(L.RMSNormBadShape, x, w)
    assert not report.passed
    message = report.to_dict()["failure"]["message"]
    assert message == str(torch_error.value), (message, str(torch_error.value))
    assert "invalid gradient at index 1 - got [301] but expected shape compatible with [300]" in message
    # A plain backward: the same rule.
    r = tilegrad.check_backward(lambda x, w: x * w, lambda x, w, g: (g * w, (g * x).sum(0, keepdim=True)), [x, w])
    assert r.passed, str(r)
    r = tilegrad.check_backward(lambda x, w: x * w, lambda x, w, g: (g * w, (g * x)[:, :299]), [x, w])
    assert "invalid gradient at index 1 - got [37, 299] but expected shape compatible with [300]" in r.to_dict()["failure"]["message"]


def ce_inputs(rows=23, cols=211):
    logits = 2 * rand(rows, cols, seed=9)
    target = torch.randint(0, cols, (rows,), generator=torch.Generator().manual_seed(10))
    target[[3, 17]] = -100
    return logits, target


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_with_its_gradient_computed_in_the_forward(reduction):
    # The forward computes the logits' gradient in place only when they require grad.
    report = check_with(L.CrossEntropy, *ce_inputs(), ignore_index=-100, reduction=reduction)
    assert report.passed, str(report)
    d = report.to_dict()
    assert [g["name"] for g in d["gradients"]] == ["_input"]
    assert [f["name"] for f in d["forward"]] == ["out0", "out1"]


def test_cross_entropy_broken_variants_fail():
    report = tilegrad.check_function(L.CrossEntropyIgnoresGradOutput, *ce_inputs())
    assert [g["name"] for g in report.to_dict()["gradients"] if not g["passed"]] == ["_input"], str(report)
    # Not marked non-differentiable, the logsumexp output gets a cotangent the backward ignores.
    assert not tilegrad.check_function(L.CrossEntropyLseUnmarked, *ce_inputs()).passed


class AddInto(torch.autograd.Function):
    """x += y in place (marked dirty)."""

    @staticmethod
    def forward(ctx, x, y):
        K.add_into[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, g


class SquareAndSign(torch.autograd.Function):
    """(x * x, sign mask marked non-differentiable); the mask's cotangent is None unless grads are
    materialized, zeros otherwise."""

    materialize = False

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(SquareAndSign.materialize)
        ctx.save_for_backward(x)
        mask = (x > 0).to(x.dtype)
        ctx.mark_non_differentiable(mask)
        return launch_square(x), mask

    @staticmethod
    def backward(ctx, g, g_mask):
        assert (g_mask is None) != SquareAndSign.materialize, g_mask
        assert g_mask is None or not g_mask.any()
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_mark_dirty():
    x, y = rand(300), rand(300, seed=8)
    assert tilegrad.check_function(AddInto, x, y).passed
    assert not tilegrad.check_backward(lambda x, y: AddInto.apply(x, y), lambda x, y, g: (g, 2 * g), [x, y]).passed


@pytest.mark.parametrize("materialize", [False, True])
def test_non_differentiable_outputs_and_materialized_grads(materialize, monkeypatch):
    monkeypatch.setattr(SquareAndSign, "materialize", materialize)
    report = tilegrad.check_function(SquareAndSign, rand(500))
    assert report.passed, str(report)


class Scale(torch.autograd.Function):
    """x * w; w's gradient only where it is needed."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        out = torch.empty_like(x)
        K.mul[(triton.cdiv(x.numel(), 64),)](x, w, out, x.numel(), BLOCK=64)
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, Scale.expect_w), ctx.needs_input_grad
        return g * w, (g * x if ctx.needs_input_grad[1] else None)


@pytest.mark.parametrize("wrt,expect_w", [(None, True), (["x"], False), ([0, 1], True)])
def test_needs_input_grad_follows_what_is_differentiated(wrt, expect_w, monkeypatch):
    monkeypatch.setattr(Scale, "expect_w", expect_w, raising=False)
    report = tilegrad.check_function(Scale, rand(333), rand(333, seed=4), wrt=wrt)
    assert report.passed, str(report)
    assert [g["name"] for g in report.to_dict()["gradients"]] == (["x", "w"] if expect_w else ["x"])


def test_given_cotangents_are_the_first_trial_layout_included():
    """`cotangents=`: the first trial's cotangent, as a training step passed it (a transposed
    one reaches the backward transposed); the others random."""
    x, w = rand(4, 6), rand(6, seed=2)
    dy = torch.randn(6, 4).t()
    assert not tilegrad.check_function(FW.ScaleForContiguous, x, w, cotangents=[dy], trials=1).passed
    assert tilegrad.check_function(FW.Scale, x, w, cotangents=dy, trials=1).passed
    with pytest.raises(ValueError, match=r"cotangents: the one of output `out` has shape \[6, 4\], the output \[4, 6\]"):
        tilegrad.check_function(FW.Scale, x, w, cotangents=[dy.t().contiguous()])
    with pytest.raises(ValueError, match="cotangents: 2 given for 1 outputs"):
        tilegrad.check_function(FW.Scale, x, w, cotangents=[dy, dy])


def test_an_in_place_function_is_differentiated_at_the_input_it_got():
    """A forward that writes its input and marks it dirty returns that tensor as its output:
    the gradient is the input's as it was given, not the output's."""
    x = rand(3, 5)
    assert tilegrad.check_function(FW.ExpInPlace, x).passed
    report = tilegrad.check_function(FW.ExpInPlaceForgetsExp, x)
    assert report.summary().startswith("tilegrad: grad_x of ExpInPlaceForgetsExp FAILS"), report.summary()

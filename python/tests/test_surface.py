"""The Python package on the rest of Triton's launch surface and the CLI's trust rules: constexprs
of every kind (float, bool, str, None, dtype) and pointers passed as None; NaN/inf inputs and
ground truths as errors; tolerances calibrated to the kernels' rounding for f16 gradients; every
`@triton.autotune` config checked with `autotune="all"`; CUDA tensors where a GPU is present."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import kernels_surface as K  # noqa: E402
import tilegrad  # noqa: E402

N = 1000  # not a multiple of the blocks


def act_launchers(act, reduction, out_dtype, eps=1e-3, bwd_eps=None):
    bwd_eps = eps if bwd_eps is None else bwd_eps

    def fwd(x, b):
        y = torch.empty(x.shape, dtype={tl.float32: torch.float32, tl.float16: torch.float16}.get(out_dtype, torch.float32))
        K.scaled_act[(triton.cdiv(x.numel(), 128),)](x, b, y, x.numel(), eps=eps, ACT=act, reduction=reduction, OUT=out_dtype, BLOCK=128)
        return y

    def bwd(x, b, gy):
        gx = torch.empty_like(x)
        K.scaled_act_bwd[(triton.cdiv(x.numel(), 128),)](x, b, gy, gx, x.numel(), eps=bwd_eps, ACT=act, reduction=reduction, BLOCK=128)
        gb = None if b is None else gx.clone()
        return gx, gb

    return fwd, bwd


@pytest.mark.parametrize("act", ["leaky_relu", None, "square"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_float_str_none_and_dtype_constexprs(act, reduction):
    x, b = torch.randn(N), torch.randn(N)
    fwd, bwd = act_launchers(act, reduction, tl.float32)
    r = tilegrad.check_backward(fwd, bwd, [x, b])
    assert r.passed, str(r)
    # A wrong float constexpr in the backward is a wrong gradient of both inputs.
    fwd, bwd = act_launchers(act, reduction, tl.float32, eps=1e-3, bwd_eps=0.05)
    r = tilegrad.check_backward(fwd, bwd, [x, b])
    assert not r.passed and "grad_x" in str(r)


def test_pointer_passed_as_none_folds_the_optional_branch():
    x = torch.randn(N)
    fwd, bwd = act_launchers("square", "sum", tl.float32)
    r = tilegrad.check_backward(lambda x: fwd(x, None), lambda x, gy: bwd(x, None, gy)[:1], [x])
    assert r.passed, str(r)
    # With the bias, the same kernels see a different input: y = (x + b)^2.
    b = torch.randn(N)
    r = tilegrad.check_backward(lambda x: fwd(x, b), lambda x, gy: bwd(x, None, gy)[:1], [x])
    assert not r.passed


def test_dtype_constexpr_from_torch_and_triton():
    x, b = torch.randn(N), torch.randn(N)
    for out in (tl.float16, torch.float16):
        def fwd(x, b, out=out):
            y = torch.empty(x.shape, dtype=torch.float16)
            K.scaled_act[(triton.cdiv(N, 128),)](x, b, y, N, eps=1e-3, ACT=None, reduction="sum", OUT=out, BLOCK=128)
            return y

        _, bwd = act_launchers(None, "sum", tl.float16)
        r = tilegrad.check_backward(fwd, bwd, [x, b])
        assert r.passed, str(r)
        assert r.to_dict()["forward"][0]["dtype"] == "f16"


def test_unsupported_constexpr_is_a_clear_error():
    x, b = torch.randn(N), torch.randn(N)
    fwd, bwd = act_launchers(object(), "sum", tl.float32)
    with pytest.raises(tilegrad.UsageError, match="constexpr `ACT`"):
        tilegrad.check_backward(fwd, bwd, [x, b])


def sqrt(x):
    y = torch.empty_like(x)
    K.sqrt_fwd[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def sqrt_bwd(x, gy):
    gx = torch.empty_like(x)
    K.sqrt_bwd[(triton.cdiv(x.numel(), 128),)](x, gy, gx, x.numel(), BLOCK=128)
    return (gx,)


def test_non_finite_inputs_and_ground_truth_are_errors():
    x = torch.rand(N) + 0.5
    assert tilegrad.check_backward(sqrt, sqrt_bwd, [x]).passed
    bad = x.clone()
    bad[17] = float("nan")
    with pytest.raises(tilegrad.NonFiniteError, match=r"input `x` is NaN at \[17\]"):
        tilegrad.check_backward(sqrt, sqrt_bwd, [bad])
    neg = x.clone()
    neg[3] = -1.0
    with pytest.raises(tilegrad.NonFiniteError, match=r"forward output `out` is NaN at \[3\]"):
        tilegrad.check_backward(sqrt, sqrt_bwd, [neg])
    zero = x.clone()
    zero[5] = 0.0
    with pytest.raises(tilegrad.NonFiniteError, match=r"ground-truth gradient of `x` \(trial 0\) is -?inf at \[5\]"):
        tilegrad.check_backward(sqrt, sqrt_bwd, [zero])
    # Allowed: the check runs, and the infinite element matches the backward's.
    r = tilegrad.check_backward(sqrt, sqrt_bwd, [zero], allow_non_finite=True)
    assert r.passed, str(r)
    assert issubclass(tilegrad.NonFiniteError, tilegrad.UsageError)


def scale16(x):
    y = torch.empty_like(x)
    K.scale[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), 1.7, BLOCK=128)
    return y


def scale16_bwd(skew):
    def bwd(x, gy):
        gx = torch.empty_like(x)
        K.scale_bwd_f16[(triton.cdiv(x.numel(), 128),)](gy, gx, x.numel(), 1.7, skew, BLOCK=128)
        return (gx,)

    return bwd


def test_f16_gradients_get_formula_and_rounding_verdicts():
    x = torch.randn(3001).half()
    good = tilegrad.check_backward(scale16, scale16_bwd(1.0), [x])
    assert good.passed, str(good)
    g = good.to_dict()["gradients"][0]
    assert g["formula_passed"] and g["rounding_passed"] and float(g["rounding_units"]) < 1.0, g
    # 0.3% too large everywhere: inside f16's elementwise rtol; not the derivative.
    bad = tilegrad.check_backward(scale16, scale16_bwd(1.003), [x])
    assert not bad.passed, str(bad)
    b = bad.to_dict()["gradients"][0]
    assert b["formula_passed"] is False and b["over_tolerance"] == 0, b
    assert "WRONG even in exact arithmetic" in str(bad), str(bad)
    # Explicit tolerances replace the rounding verdict, not the formula's.
    loose = tilegrad.check_backward(scale16, scale16_bwd(1.003), [x], rtol=1e-2, atol=1e-3)
    assert not loose.passed and loose.to_dict()["gradients"][0]["formula_passed"] is False


def scale32(x):
    y = torch.empty_like(x)
    K.scale[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), 0.5, BLOCK=128)
    return y


def scale32_bwd(x, gy):
    gx = torch.empty_like(x)
    K.scale_bwd_unmasked[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](gy, gx, x.numel(), 0.5)
    return (gx,)


def test_every_autotune_config_is_checked_with_all():
    x = torch.randn(384)  # BLOCK 128 divides it, BLOCK 256 does not
    assert tilegrad.check_backward(scale32, scale32_bwd, [x]).passed
    r = tilegrad.check_backward(scale32, scale32_bwd, [x], autotune="all")
    assert not r.passed
    text = str(r)
    assert "[autotune config 1]" in text and "out-of-bounds access to `gy_ptr`" in text, text
    assert tilegrad.check_backward(scale32, scale32_bwd, [torch.randn(512)], autotune="all").passed
    with pytest.raises(ValueError, match="autotune"):
        tilegrad.check_backward(scale32, scale32_bwd, [x], autotune="every")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_are_checked_on_the_host_and_written_back():
    x = torch.randn(N, device="cuda")
    b = torch.randn(N, device="cuda")
    fwd, bwd = act_launchers("leaky_relu", "mean", tl.float32)
    r = tilegrad.check_backward(fwd, bwd, [x, b])
    assert r.passed, str(r)
    fwd, bwd = act_launchers("leaky_relu", "mean", tl.float32, bwd_eps=0.05)
    assert not tilegrad.check_backward(fwd, bwd, [x, b]).passed
    # Launches in intercept mode write their results into the CUDA tensor.
    y = torch.empty(N, device="cuda")
    with tilegrad.intercept():
        K.scaled_act[(triton.cdiv(N, 128),)](x, b, y, N, eps=0.0, ACT=None, reduction="sum", OUT=tl.float32, BLOCK=128)
    torch.testing.assert_close(y, x + b)
    # A view of a CUDA tensor, with an offset into its storage.
    big = torch.randn(2 * N, device="cuda")
    r = tilegrad.check_backward(lambda v: fwd(v, None), lambda v, gy: act_launchers("leaky_relu", "mean", tl.float32)[1](v, None, gy)[:1], [big[N // 2 : N // 2 + N]])
    assert r.passed, str(r)


def row_scale(x, w):
    y = torch.empty_like(x)
    K.row_scale[(x.shape[0],)](x, w, y, x.shape[0], x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def row_scale_bwd(x, w, gy):
    programs, per = 7, triton.cdiv(x.shape[0], 7)
    gx = torch.empty_like(x)
    # Per-program partial sums in f32 whatever the dtype, summed on the host (as libraries do).
    dw_part = torch.empty((programs, x.shape[1]), dtype=torch.float32, device=x.device)
    K.row_scale_bwd[(programs,)](x, w, gy, gx, dw_part, x.shape[0], x.shape[1], per, BLOCK=triton.next_power_of_2(x.shape[1]))
    return gx, dw_part.sum(0).to(w.dtype)


def test_the_exact_replay_promotes_the_float_dtypes_host_code_asks_for():
    # The f32 partial `dW` buffer is f64 in the replay: the formula is judged at f64's precision
    # (an f32 buffer would leave the replay a few f32 roundings off, near the formula's limit).
    x, w = torch.randn(203, 301).half(), (torch.rand(301) + 0.5).half()
    r = tilegrad.check_backward(row_scale, row_scale_bwd, [x, w])
    assert r.passed, str(r)
    for g in r.to_dict()["gradients"]:
        assert g["formula_error"] < 1e-12, g


_TO_TRITON = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}  # no f64, as in libraries


def row_scale_bwd_table(skew):
    def bwd(x, w, gy):
        _TO_TRITON[x.dtype]  # host code that cannot run on f64 tensors
        gx, dw = row_scale_bwd(x, w, gy)
        return gx * skew, dw

    return bwd


def test_a_replay_host_code_cannot_run_in_f64_runs_on_f32_tensors_against_a_limit_of_f32_stores():
    x, w = torch.randn(203, 301).bfloat16(), (torch.rand(301) + 0.5).bfloat16()
    good = tilegrad.check_backward(row_scale, row_scale_bwd_table(1.0), [x, w])
    assert good.passed, str(good)
    for g in good.to_dict()["gradients"]:
        assert g["formula_limit"] == 2.0**-20 and g["formula_passed"], g
    # 0.1% too large: a tenth of bf16's roundoff, found by the replay on f32 tensors.
    bad = tilegrad.check_backward(row_scale, row_scale_bwd_table(1.001), [x, w])
    gx = bad.to_dict()["gradients"][0]
    assert not bad.passed and gx["formula_passed"] is False and gx["over_tolerance"] == 0, str(bad)

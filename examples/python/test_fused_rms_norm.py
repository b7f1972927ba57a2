"""Checks the hand-written backward of `fused_rms_norm.RMSNormFunction` with tilegrad, on CPU
tensors (no GPU needed):

    pytest examples/python                          # on tilegrad's CPU engine
    pytest examples/python --tilegrad-backend gpu   # the `tilegrad` fixture's checks on a GPU
"""

import torch

import tilegrad
from fused_rms_norm import RMSNormFunction


def test_rms_norm_backward(tilegrad):  # noqa: F811 - the fixture of tilegrad's pytest plugin
    # The fixture's checks assert, with the command line's backend and seed.
    torch.manual_seed(0)
    x = torch.randn(64, 300)
    w = torch.rand(300) + 0.5
    tilegrad.check_function(RMSNormFunction, x, w, 1e-6)


def test_rms_norm_backward_of_a_batch_in_half_precision():
    torch.manual_seed(0)
    x = torch.randn(4, 16, 256).half()
    w = (torch.rand(256) + 0.5).half()
    report = tilegrad.check_function(RMSNormFunction, x, w, 1e-5)
    report.assert_passes()  # raises AssertionError: the verdict, then the report's table
    assert [g["name"] for g in report.to_dict()["gradients"]] == ["x", "w"]


class ScaledDW(RMSNormFunction):
    """A broken backward, as a test that the check catches it: `dw` twice too large."""

    @staticmethod
    def backward(ctx, dy):
        dx, dw, _ = RMSNormFunction.backward(ctx, dy)
        return dx, 2 * dw, None


def test_a_wrong_dw_fails():
    torch.manual_seed(0)
    report = tilegrad.check_function(ScaledDW, torch.randn(64, 300), torch.rand(300) + 0.5, 1e-6)
    assert not report.passed
    grads = {g["name"]: g["passed"] for g in report.to_dict()["gradients"]}
    assert grads == {"x": True, "w": False}, report
    assert report.summary().startswith("tilegrad: grad_w of ScaledDW FAILS: 300/300 over tolerance"), report.summary()

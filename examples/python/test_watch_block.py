"""Trains the transformer block of `watch_block.py` for three steps under `tilegrad.watch`, on CPU
tensors: every Function is checked on the first step with the cotangent autograd gives it; the
broken SwiGLU backward is caught, with the kernel line that computes its wrong gradient.

    pytest examples/python/test_watch_block.py
"""

import io
import pathlib

import pytest
import torch

import tilegrad
from watch_block import Block, SwiGLUForgetsSigmoidTerm, SwiGLUFunction, train

FUNCTIONS = ["RMSNormFunction", "RoPEFunction", "SwiGLUFunction", "CrossEntropyFunction"]


def watched_training(swiglu: type, **options):
    """The watch of three training steps of a block with the SwiGLU `swiglu`."""
    torch.manual_seed(0)
    model = Block(swiglu=swiglu)
    with tilegrad.watch(model, file=io.StringIO(), **options) as watch:
        losses = train(model, steps=3)
    assert len(losses) == 3
    return watch


def line_of(text: str) -> int:
    """The line of watch_block.py that holds `text`."""
    lines = pathlib.Path(__file__).with_name("watch_block.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_every_function_of_the_block_is_checked_and_passes():
    watch = watched_training(SwiGLUFunction, on_fail="raise")
    assert [(c.function, c.status) for c in watch.reports] == [(f, "pass") for f in FUNCTIONS], watch.summary()
    summary = watch.file.getvalue()
    assert summary.startswith("tilegrad.watch: 4 Functions launching Triton kernels, 4 of 21 calls checked, all passing"), summary
    for name in FUNCTIONS:
        row = next(line for line in summary.splitlines() if line.split()[:1] == [name])
        assert "watch_block.py:" in row and row.split()[-1] == "ok", row


def test_the_broken_swiglu_fails_naming_its_line():
    with pytest.warns(tilegrad.WatchWarning, match="grad_gate of SwiGLUForgetsSigmoidTerm FAILS"):
        watch = watched_training(SwiGLUForgetsSigmoidTerm)  # on_fail="warn", the default
    verdicts = {c.function: c.status for c in watch.reports}
    assert verdicts == {"RMSNormFunction": "pass", "RoPEFunction": "pass", "SwiGLUForgetsSigmoidTerm": "FAIL", "CrossEntropyFunction": "pass"}
    line = line_of("silu'(g) is sig * (1 + g * (1 - sig))")
    failing = next(c for c in watch.reports if c.status == "FAIL")
    assert failing.site == f"watch_block.py:{line_of('self.swiglu.apply(gate, up)')}"
    assert f"(written at watch_block.py:{line}, kernel `swiglu_bwd_kernel_no_sigmoid_term`)" in failing.report.summary()
    assert "grad_gate of SwiGLUForgetsSigmoidTerm FAILS" in watch.summary()


def test_on_fail_raise_stops_the_training_step_at_the_broken_backward():
    with pytest.raises(AssertionError, match=r"^tilegrad: grad_gate of SwiGLUForgetsSigmoidTerm FAILS"):
        watched_training(SwiGLUForgetsSigmoidTerm, on_fail="raise")

"""The Python report's blame is the CLI's: the data flow of the worst element through the backward
launch that wrote it, through host code between launches (the torch line that computed the
gradient), the first non-finite value, and no blame on allocations the element never came from."""

from __future__ import annotations

import pathlib
import re

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import report_funcs as F  # noqa: E402
import tilegrad  # noqa: E402

SRC = pathlib.Path(F.__file__).read_text().splitlines()
FILE = pathlib.Path(F.__file__).name


def line_of(marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(SRC) if marker in text]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def at(line: int) -> str:
    return f"{FILE}:{line}"


def flow(text: str, tensor: str) -> list[str]:
    """The data-flow lines of the report's blame of `tensor`, in order."""
    block = text.split(f"worst element of `{tensor}`", 1)[1].split("data flow of the element", 1)[1]
    lines = []
    for ln in block.splitlines()[1:]:
        if not ln.startswith("        "):
            break
        lines.append(ln)
    return lines


def via(text: str, tensor: str) -> list[str]:
    block = text.split(f"worst element of `{tensor}`", 1)[1].split("\n    `", 1)[0]
    return [ln.strip() for ln in block.splitlines() if ln.strip().startswith("via ")]


def row_norm_inputs(rows=37, cols=300, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g), torch.rand(cols, generator=g) + 0.5


def test_row_norm_passes():
    r = tilegrad.check_function(F.RowNorm, *row_norm_inputs())
    assert r.passed, str(r)


def test_wrong_kernel_line_for_host_summed_dw_names_the_kernel_line_and_the_sum():
    r = tilegrad.check_function(F.RowNormBadDw, *row_norm_inputs())
    assert not r.passed
    text = str(r)
    g = {d["name"]: d for d in r.to_dict()["gradients"]}
    assert g["w"]["passed"] is False and g["x"]["passed"] is True, text
    host, bug = line_of("# HOST: the weight gradient"), line_of("# BUG: dw:")
    vias = via(text, "grad_w")
    assert vias and at(host) in vias[0] and "part.sum(0)" in vias[0], text
    assert "from `part`[:, " in vias[0], text
    lines = flow(text, "grad_w")
    assert lines and at(bug) in lines[0], text
    # The host line comes before the kernel's lines in the report.
    assert text.index(at(host)) < text.index(at(bug))
    blame = g["w"]["worst"]["blame"]
    assert any(at(host) in v for v in blame["via"])
    assert blame["slice"]["lines"][0]["loc"].split(":")[-2] == str(bug)


def test_wrong_host_line_is_named_first():
    r = tilegrad.check_function(F.RowNormBadHost, *row_norm_inputs(cols=77))
    assert not r.passed
    text = str(r)
    bug = line_of("# BUG: host: the sum doubled")
    vias = via(text, "grad_w")
    worst = next(d for d in r.to_dict()["gradients"] if d["name"] == "w")["worst"]["index"][0]
    assert vias and at(bug) in vias[0] and f"(torch `mul`, `sum`): from `part`[:, {worst}]" in vias[0], text
    # Followed on to the kernel that wrote the partial rows, which is not at fault.
    assert "written by `store`" in text and "_row_norm_bwd" in text, text


def test_wrong_dx_line_is_in_the_data_flow_first():
    r = tilegrad.check_function(F.RowNormBadDx, *row_norm_inputs(rows=13, cols=45))
    assert not r.passed
    text = str(r)
    g = {d["name"]: d for d in r.to_dict()["gradients"]}
    assert g["x"]["passed"] is False and g["w"]["passed"] is True, text
    bug = line_of("# BUG: dx:")
    lines = flow(text, "grad_x")
    assert lines and at(bug) in lines[0], text
    assert not via(text, "grad_x"), text  # written by the kernel itself: no host step


def test_host_gradient_is_not_blamed_on_an_unused_empty():
    x = torch.randn(1001, generator=torch.Generator().manual_seed(3))
    assert tilegrad.check_function(F.Triple, x).passed
    r = tilegrad.check_function(F.TripleBadHost, x)
    assert not r.passed
    text = str(r)
    bug = line_of("# BUG: host: the factor is 3")
    vias = via(text, "grad_x")
    assert vias and at(bug) in vias[0], text
    assert "empty at" not in text and "never written" not in text, text
    assert "taken unchanged from the given tensor" in text, text


def test_kernel_gradient_is_not_blamed_on_an_unused_empty():
    x = torch.randn(1001, generator=torch.Generator().manual_seed(4))
    r = tilegrad.check_function(F.TripleBadKernel, x)
    assert not r.passed
    text = str(r)
    bug = line_of("# BUG: kernel: a constant added")
    assert f"written by `store` at {F.__file__}:{bug}:" in text, text
    assert "empty at" not in text and "never written" not in text, text


def test_in_place_host_steps_are_followed_to_the_kernel():
    r = tilegrad.check_function(F.TripleInPlace, torch.randn(300, generator=torch.Generator().manual_seed(5)))
    assert not r.passed
    text = str(r)
    bug = line_of("# BUG: in place: a slice shifted")
    vias = via(text, "grad_x")
    assert len(vias) == 2 and at(bug) in vias[0] and "dx.mul_(3.0)" in vias[1], text
    # The worst element is one of the slice's four (which one depends on the cotangent).
    assert re.search(r"\(torch `__setitem__`, `add_`\): from `dx \(a view\)`\[[0-3]\]", vias[0]), text
    assert f"written by `store` at {F.__file__}:{line_of('# STORE: scaled')}:" in text, text


def test_none_gradient_is_not_blamed_on_an_unused_empty():
    class NoneGrad(F.Triple):
        @staticmethod
        def backward(ctx, dy):
            dummy = torch.empty(1, dtype=torch.float32)  # noqa: F841
            return None

    r = tilegrad.check_function(NoneGrad, torch.randn(300))
    text = str(r)
    assert "empty at" not in text and "never written" not in text, text


def test_nan_origin_is_the_tensor_read():
    def backward(x, dy):
        dummy = torch.empty(1)  # noqa: F841 - never written, never read
        dx = torch.empty_like(dy)  # read before it is written: NaN
        F._accumulate_bwd[(triton.cdiv(dy.numel(), 128),)](dy, dx, dy.numel(), 3.0, BLOCK=128)
        return (dx,)

    def forward(x):
        return F.Triple.forward(None, x)

    r = tilegrad.check_backward(forward, backward, [torch.randn(700)])
    assert not r.passed
    text = str(r)
    bug = line_of("# BUG: nan: reads the gradient before writing it")
    m = re.search(r"first non-finite value: `load` at (\S+) .*read NaN from element \d+ of `(\w+)`", text)
    assert m, text
    assert m.group(1).startswith(f"{F.__file__}:{bug}:") and m.group(2) == "DX", text
    assert "empty at" not in text.split("first non-finite")[0].split("worst element")[1], text

"""The error map of a failing report (`report.error_map()`, the same map as the CLI's JSON) and
the HTML page (`report.to_html(path)`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import kernels as K  # noqa: E402
import tilegrad  # noqa: E402

ROWS, COLS = 16, 300


def triple(x):
    y = torch.empty_like(x)
    K.scale_rows[(ROWS,)](x, y, ROWS, COLS, x.stride(0), x.stride(1), y.stride(0), y.stride(1), 3.0, BLOCK=512)
    return y


def triple_bwd_short(x, gy):
    # A launch whose column count misses the last 44 columns: they are never written.
    gx = torch.empty_like(x)
    K.scale_rows[(ROWS,)](gy, gx, ROWS, COLS - 44, gy.stride(0), gy.stride(1), gx.stride(0), gx.stride(1), 3.0, BLOCK=512)
    return (gx,)


def triple_bwd(x, gy):
    gx = torch.empty_like(x)
    K.scale_rows[(ROWS,)](gy, gx, ROWS, COLS, gy.stride(0), gy.stride(1), gx.stride(0), gx.stride(1), 3.0, BLOCK=512)
    return (gx,)


def failing():
    return tilegrad.check_backward(triple, triple_bwd_short, [torch.randn(ROWS, COLS)])


def test_a_tail_of_columns_never_written_is_the_last_cells_of_every_row():
    r = failing()
    assert not r.passed
    m = r.error_map("x")
    assert m["summary"] == "columns 256..299 of every row"
    assert (m["rows"], m["cols"], m["slices"], m["over"]) == (ROWS, COLS, 1, ROWS * 44)
    assert len(m["cells"]) == ROWS and all(len(row) == 64 for row in m["cells"])
    hot = {(i, j) for i, row in enumerate(m["cells"]) for j, f in enumerate(row) if f > 0}
    tail = {j for j, (a, b) in enumerate(m["col_bins"]) if b > 256}
    assert hot == {(i, j) for i in range(ROWS) for j in tail}
    assert {tuple(c) for c in m["nan_cells"]} == hot
    # By tensor name, and every map at once; the text report shows it too.
    assert r.error_map("grad_x") == m and r.error_map() == {"x": m}
    assert "error map of `grad_x`: columns 256..299 of every row" in str(r)
    with pytest.raises(KeyError):
        r.error_map("nope")


def test_a_passing_report_has_no_map():
    r = tilegrad.check_backward(triple, triple_bwd, [torch.randn(ROWS, COLS)])
    assert r.passed, str(r)
    assert r.error_map() == {} and r.error_map("x") is None


def test_to_html_writes_a_self_contained_page(tmp_path):
    r = failing()
    path = r.to_html(tmp_path / "report.html")
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    assert html.count('<svg class="heatmap" data-tensor="grad_x"') == 1
    assert html.count('<rect class="cell') == ROWS * 64
    assert "http://" not in html and "https://" not in html
    assert "columns 256..299 of every row" in html

"""Every ```python block of README.md and docs/*.md, run (tests/docs.rs runs the blocks in the
other languages).

A page's blocks run in order in one namespace, as a module in examples/python (the pages show
the example's tests); after each block, the `test_*` functions it defined are called with the
pytest fixtures their parameters name (`tilegrad`, the plugin's fixture). A ```text block right
after a python block (nothing but blank lines between) is what that block prints, or the
exception it raises (`AssertionError: ...`): each of its lines appears in that output, in order
(a `...` line stands for any lines). A block may raise only where such a sample shows it.
`python no-run` marks a block that cannot run as shown; a page whose blocks import torch or
triton skips where they are missing."""

from __future__ import annotations

import contextlib
import inspect
import io
import pathlib
import re
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Block:
    line: int
    lang: str
    attrs: list[str]
    code: str
    follows_block: bool  # only blank lines between the block before it and this one

    @property
    def runs(self) -> bool:
        return "no-run" not in self.attrs


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a page."""
    out: list[Block] = []
    lines = text.splitlines()
    open_at, info, last_close = None, "", None
    for i, line in enumerate(lines):
        if open_at is None and line.strip().startswith("```"):
            open_at, info = i, line.strip()[3:].strip()
        elif open_at is not None and line.strip() == "```":
            words = info.replace(",", " ").split() or [""]
            follows = last_close is not None and all(not l.strip() for l in lines[last_close + 1 : open_at])
            code = "".join(l + "\n" for l in lines[open_at + 1 : i])
            out.append(Block(open_at + 1, words[0], words[1:], code, follows))
            open_at, last_close = None, i
    return out


def missing_line(sample: str, output: str) -> str | None:
    """The first line of `sample` (`...` aside) not among the lines of `output`, in order."""
    got = iter(l.rstrip() for l in output.splitlines())
    for want in (l.rstrip() for l in sample.splitlines()):
        if want.strip() != "..." and not any(g == want for g in got):
            return want
    return None


def pages_with_python() -> list:
    found = []
    for page in PAGES:
        if any(b.lang == "python" and b.runs for b in blocks(page.read_text())):
            name = str(page.relative_to(ROOT))
            found.append(pytest.param(page, id=name))
    return found


def test_the_pages_have_python_blocks():
    names = [p.id for p in pages_with_python()]
    assert "README.md" in names and "docs/python.md" in names, names


def test_the_block_parser_and_samples():
    page = "a\n```python\nx = 1\n```\n\n```text\nout\n```\n```python no-run\ny\n```\nprose\n```text\nz\n```\n"
    seen = [(b.line, b.lang, b.runs, b.follows_block, b.code) for b in blocks(page)]
    assert seen == [
        (2, "python", True, False, "x = 1\n"),
        (6, "text", True, True, "out\n"),
        (9, "python", False, True, "y\n"),
        (13, "text", True, False, "z\n"),
    ]
    assert missing_line("a\n...\n  b\n", "a\nx\n  b  \n") is None
    assert missing_line("b\na\n", "a\nb\n") == "a"


class Ran:
    """What a block printed, and the exception it raised (if it did)."""

    def __init__(self, output: str, error: BaseException | None):
        self.output, self.error = output, error


def run_block(name: str, code: str, namespace: dict, request) -> Ran:
    before = set(namespace)
    out = io.StringIO()
    error = None
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, name, "exec"), namespace)
        except Exception as e:  # shown by the sample after the block, or raised again
            error = e
    text = out.getvalue() + (f"{type(error).__name__}: {error}\n" if error else "")
    for n in [n for n in namespace if n not in before and n.startswith("test_") and callable(namespace[n])]:
        test = namespace[n]
        test(**{p: request.getfixturevalue(p) for p in inspect.signature(test).parameters})
    return Ran(text, error)


@pytest.mark.parametrize("page", pages_with_python())
def test_page(page: pathlib.Path, request, monkeypatch):
    page_blocks = blocks(page.read_text())
    code = "".join(b.code for b in page_blocks if b.lang == "python" and b.runs)
    for module in ("torch", "triton"):
        if re.search(rf"^\s*(import|from) {module}\b", code, re.M):
            pytest.importorskip(module)
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "python"))
    namespace: dict = {"__name__": "doc_page"}
    ran: Ran | None = None
    for b in page_blocks:
        name = f"{page.relative_to(ROOT)}:{b.line}"
        sample = b.lang == "text" and b.follows_block and ran is not None
        if ran is not None and ran.error is not None and not sample:
            raise AssertionError(f"a block before {name} raised, and no sample after it shows it") from ran.error
        if sample:
            missing = missing_line(b.code, ran.output)
            assert missing is None, f"{name}: the sample's line\n{missing}\nis not in the block's output (in order):\n{ran.output}"
        ran = run_block(name, b.code, namespace, request) if b.lang == "python" and b.runs else None
    if ran is not None and ran.error is not None:
        raise ran.error

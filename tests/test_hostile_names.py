"""Names a model chooses reach no output as they are: a terminal gets no escape sequence, Markdown no HTML and no
broken code span or table, JSON stays valid, the HTML page escapes. Every format, every command that prints a
model's names, on names written as an attacker would."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import onnx.helper as oh
import pytest

from onnxmem.views.safe import markdown_code, markdown_text, terminal_text

from . import graphs
from .cli import run, save

# What an attacker writes into names: clear screen, window title (OSC), a hyperlink (OSC 8), a bell, a carriage
# return over the line, 8-bit CSI, a right-to-left override, HTML, Markdown code-span, table and link syntax.
HOSTILE = [
    "\x1b[2J\x1b[Hcleared",
    "\x1b]0;owned\x07title",
    "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\",
    "bell\x07\x07",
    "over\rwrite",
    "csi\x9b31m",
    "rtl\u202eexe.onnx",
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "tick`s and ``double``",
    "pipe|in|table",
    "new\nline\n| forged | row |",
    "[click](javascript:alert(1))",
]

# Anything a terminal acts on: ESC, BEL, CR, the C1 range, bidirectional overrides.
_TERMINAL_ACTIVE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def hostile_model() -> onnx.ModelProto:
    """Relu nodes each named, with their outputs, by one hostile string, all read by one Sum (so every one of them
    is live at its peak, and listed); the graph named by another."""
    nodes = [oh.make_node("Relu", ["x"], [f"{name}#{i}"], name=f"{name}@{i}") for i, name in enumerate(HOSTILE)]
    nodes.append(oh.make_node("Sum", [n.output[0] for n in nodes], ["y"], name="last"))
    model = graphs.model(nodes, [graphs.value("x", ["batch", 64])], [graphs.value("y", ["batch", 64])])
    model.graph.name = HOSTILE[0]
    return model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save(hostile_model(), tmp_path_factory.mktemp("hostile") / "m\x1b[31m\u202e.onnx")


@pytest.mark.parametrize("command", [
    ["report", "--top", "40"],
    ["report", "--top", "40", "--training", "--device", "cpu"],
    ["fit", "--memory", "1GiB", "--reserve", "0B"],
    ["check", "--budget", "1GiB", "--reserve", "0B"],
])
@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_text_formats_carry_no_terminal_control(model_path: str, command: list[str], fmt: str) -> None:
    dims = [] if command[0] == "fit" else ["--dim", "batch=2"]
    code, out, err = run(command[0], model_path, *command[1:], *dims, "--format", fmt)
    assert code == 0, err
    assert "\\x1b[31m" in out  # the file's name, shown with its escape made visible
    assert not _TERMINAL_ACTIVE.search(out), repr(_TERMINAL_ACTIVE.search(out))
    assert not _TERMINAL_ACTIVE.search(err)
    if command[0] == "report":
        # the names are still there, made visible: the ESC of the first one written as \x1b
        assert "\\x1b[2J\\x1b[Hcleared" in out


def test_markdown_shows_no_html_and_keeps_its_table(model_path: str) -> None:
    code, out, _ = run("report", model_path, "--dim", "batch=2", "--top", "40", "--format", "markdown")
    assert code == 0
    assert "<script>" not in out and "<img" not in out
    assert "&lt;script&gt;" in out  # shown as text
    live = out.split("## Live at the peak", 1)[1].split("\n\n", 2)[1].splitlines()
    assert live[0].startswith("| tensor |")
    # every row of the table has its five cells: no forged row, no pipe that splits a cell
    for row in live[2:]:
        cells = re.split(r"(?<!\\)\|", row)
        assert len(cells) == 7, row  # (the empty strings before the first and after the last pipe)
    assert "| forged | row |" not in out


def test_json_stays_valid_and_exact(model_path: str) -> None:
    code, out, _ = run("report", model_path, "--dim", "batch=2", "--top", "40", "--format", "json")
    assert code == 0
    assert not _TERMINAL_ACTIVE.search(out)
    document = json.loads(out)
    names = {t["name"] for t in document["inference"]["live_at_peak"]}
    assert any(n.startswith("\x1b[2J") for n in names) or any(n.startswith("new\nline") for n in names)
    code, out, _ = run("report", model_path, "--dim", "batch=2", "--format", "jsonl")
    assert code == 0 and json.loads(out)["schema"].startswith("onnxmem.report/")


def test_html_escapes_every_name(model_path: str, tmp_path: Path) -> None:
    code, out, _ = run("report", model_path, "--dim", "batch=2", "--top", "40", "--format", "html")
    assert code == 0
    assert "<script>alert" not in out and "<img src=x" not in out
    assert "&lt;script&gt;" in out


def test_the_escapes_by_hand() -> None:
    assert terminal_text("plain text\n\tindented") == "plain text\n\tindented"
    assert terminal_text("a\x1b[2Jb\x07") == "a\\x1b[2Jb\\x07"
    assert terminal_text("r\u202el") == "r\\u202el"
    assert markdown_code("a_b") == "`a_b`"
    assert markdown_code("a`b") == "`` a`b ``"
    assert markdown_code("a|b\nc") == "`a\\|b c`"
    assert markdown_text("<b>&") == "&lt;b&gt;&amp;"
    assert markdown_text("[x](y) *z*") == "\\[x\\](y) \\*z\\*"


def test_a_line_feed_in_the_model_s_file_name_stays_in_the_title_line(tmp_path: Path) -> None:
    # the title names the file on one line: a line feed or tab in the name is written as \n, \t
    path = save(graphs.model([oh.make_node("Relu", ["x"], ["y"], name="r")], [graphs.value("x", [2, 4])],
                             [graphs.value("y", [2, 4])]), tmp_path / "a\nforged line\t.onnx")
    code, out, err = run("report", path)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("onnxmem report: ") and "\\nforged line\\t.onnx" in first
    assert not any(line.startswith("forged line") for line in out.splitlines())

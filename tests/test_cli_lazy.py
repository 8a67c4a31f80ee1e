"""The CLI's options whose choices are tables of the training step or of fit (optimizers, losses, runtimes, ...)
read them at first need: each default must be one of the names, and an inference report must not load the
training step's modules, nor fit's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from onnxmem.cli import commands as cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _table_options() -> list[tuple[str, click.Option]]:
    found = []
    for name, command in cli.main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, cli._TableChoice):
                found.append((name, param))
    return found


def test_every_table_option_is_found() -> None:
    names = {param.name for _, param in _table_options()}
    assert {"optimizer", "precision", "device", "loss", "cpu_isa", "runtime", "shard"} <= names
    assert {command for command, _ in _table_options()} >= {"report", "fit", "check"}


@pytest.mark.parametrize("command,param", _table_options(), ids=lambda x: getattr(x, "name", x))
def test_a_default_is_one_of_the_names(command: str, param: click.Option) -> None:
    assert isinstance(param.type, cli._TableChoice)
    choices = param.type.choices
    assert choices and all(isinstance(c, str) for c in choices)
    if param.default is not None:
        assert param.default in choices, f"{command} --{param.name}: default {param.default!r} not in {choices}"


def test_a_value_not_in_the_table_is_refused() -> None:
    result = CliRunner().invoke(
        cli.main, ["report", str(FIXTURES / "gpt_decoder.onnx"), "--dim", "batch=1", "--dim", "seq=8",
                   "--training", "--loss", "nope"])
    assert result.exit_code == 2
    assert "'nope' is not one of" in result.output and "'cross_entropy'" in result.output


def _modules_after(*args: str) -> list[str]:
    """Give the onnxmem modules loaded after `onnxmem ARGS` runs in a fresh process."""
    code = ("import sys, json; from onnxmem import cli\n"
            "try:\n"
            "    cli.main(sys.argv[1:], standalone_mode=False)\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('onnxmem'))), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_an_inference_report_does_not_load_the_training_or_fit_modules() -> None:
    args = ("report", str(FIXTURES / "gpt_decoder.onnx"), "--dim", "batch=1", "--dim", "seq=8", "--format", "json")
    loaded = _modules_after(*args)
    assert "onnxmem.passes.pipeline" in loaded
    assert "onnxmem.training.step" not in loaded and "onnxmem.training.rules" not in loaded
    assert "onnxmem.plan.fit" not in loaded and "onnxmem.plan.family" not in loaded
    assert "onnxmem.training.step" in _modules_after(*args, "--training")

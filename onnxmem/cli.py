"""The onnxmem command: parse options, call the library, render, map errors to exit codes.

Exit codes: 0 success, 2 bad input (a one-line message on stderr), 3 an internal error (a bug: rerun
with --debug for the traceback).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from .analyze import analyze
from .errors import OnnxMemError
from .render import render
from .schedule import ORDERS
from .shapes import parse_dims

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


def _run(debug: bool, work: Any) -> None:
    try:
        work()
    except OnnxMemError as exc:
        if debug:
            raise
        click.echo(f"onnxmem: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except (KeyboardInterrupt, SystemExit, click.exceptions.Exit):
        raise
    except Exception as exc:
        if debug:
            raise
        text = " ".join(str(exc).split())[:300]
        click.echo(f"onnxmem: internal error: {type(exc).__name__}: {text} (rerun with --debug and report it)",
                   err=True)
        sys.exit(EXIT_INTERNAL)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="onnxmem")
def main() -> None:
    """Static memory analysis of ONNX models: will it fit, and at what batch size?"""


@main.command()
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
              help="Bind a symbolic dim, e.g. --dim batch=8 --dim seq=512 (repeatable).")
@click.option("--default-dim", type=int, default=None, metavar="N",
              help="Bind every dim not given with --dim to N (a warning names them).")
@click.option("--order", type=click.Choice(ORDERS), default="model", show_default=True,
              help="Execution order: the model's own node order, or a topological sort.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True)
@click.option("--top", type=int, default=10, show_default=True, help="Rows in each table.")
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def report(model: str, dims: tuple[str, ...], default_dim: int | None, order: str, fmt: str, top: int,
           debug: bool) -> None:
    """Report weights, inputs and the inference peak of activations of MODEL."""

    def work() -> None:
        result = analyze(model, parse_dims(dims), default_dim=default_dim, order=order)
        click.echo(render(result, fmt, top))

    _run(debug, work)


if __name__ == "__main__":  # pragma: no cover
    main()

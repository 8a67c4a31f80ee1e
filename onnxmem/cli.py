"""The onnxmem command: parse options, call the library, render, map errors to exit codes.

Exit codes: 0 success, 2 bad input (a one-line message on stderr), 3 an internal error (a bug: rerun
with --debug for the traceback).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from typing import Any

import click

from .analyze import analyze
from .dims import parse_dims
from .errors import OnnxMemError, one_line
from .formats import FORMATS, formats_help, validation_formats
from .orders import DEFAULT_ORDER, ORDERS, orders_help
from .plan import RUNTIMES, SHARD_STAGES
from .plan import check as plan_check
from .plan import fit as plan_fit
from .render import render_targets, render_validation
from .rules.training import LOSSES, OPTIMIZER_ALIASES, OPTIMIZERS
from .runtime.cpu import OPT_LEVELS
from .series import series_of
from .training import DEVICES, PRECISIONS, training_options
from .transforms import DEFAULT_PROVIDER, PROVIDERS

EXIT_BAD_INPUT = 2
REPORT_PROVIDERS = list(PROVIDERS)
PROVIDER_HELP = ("The onnxruntime execution provider the estimate assumes: cuda (a GPU's question) or cpu, whose "
                 "missing float16 kernels make onnxruntime run float16 models partly in float32, between Casts it "
                 "inserts.")
EXIT_INTERNAL = 3


def run() -> None:
    """The console command: main(), then an exit that skips freeing the analysis object by object (the
    interpreter's teardown of a 100k-node graph takes 0.08 s; nothing is left to clean up, as every file was
    written and closed by then).

    SIGINT and SIGTERM end the command with one line and exit 130 or 143, after every `with` block on the way
    out has closed (validate's temporary folder is removed); a second signal ends it at once."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    try:
        main()
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    except _Interrupted as exc:
        click.echo(f"onnxmem: {'interrupted' if exc.signum == signal.SIGINT else 'terminated'}", err=True)
        code = 128 + exc.signum
    except KeyboardInterrupt:  # a SIGINT that came before the handler was set
        click.echo("onnxmem: interrupted", err=True)
        code = 128 + signal.SIGINT
    if isinstance(code, str):  # sys.exit("message"): printed to stderr, exit 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # onnxmem report ... | head: the reader left
        code = code or 1
    os._exit(code or 0)


class _Interrupted(BaseException):
    """A SIGINT or SIGTERM received while a command ran: raised where the command is, so that it unwinds (no
    `except Exception` catches it) and its `with` blocks close."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: Any) -> None:
    for other in (signal.SIGINT, signal.SIGTERM):
        signal.signal(other, signal.SIG_DFL)  # a second signal ends the process at once
    raise _Interrupted(signum)


def _run(debug: bool, work: Any) -> None:
    try:
        work()
    except OnnxMemError as exc:
        if debug:
            raise
        click.echo(f"onnxmem: error: {one_line(str(exc))}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except (KeyboardInterrupt, SystemExit, click.exceptions.Exit):
        raise
    except MemoryError:
        if debug:
            raise
        click.echo("onnxmem: error: out of memory: the model needs more memory than this process may use", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except Exception as exc:
        if debug:
            raise
        text = one_line(" ".join(str(exc).split()), 300)
        click.echo(f"onnxmem: internal error: {type(exc).__name__}: {text} (rerun with --debug and report it)",
                   err=True)
        sys.exit(EXIT_INTERNAL)


# Training options, shared by report, fit and check.
_TRAINING_OPTIONS = [
    click.option("--training", is_flag=True, help="Also report the memory of one training step."),
    click.option("--optimizer", type=click.Choice(sorted([*OPTIMIZERS, *OPTIMIZER_ALIASES])), default="adamw",
                 show_default=True, help="Training: the optimizer (sgd-momentum, adam8bit, ...)."),
    click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True,
                 help="Training: fp32, autocast mixed precision with fp32 master weights, or pure bf16."),
    click.option("--freeze", multiple=True, metavar="PATTERN",
                 help="Training: freeze parameters whose name or module path matches (fnmatch; repeatable)."),
    click.option("--train", "train_only", multiple=True, metavar="PATTERN",
                 help="Training: train only parameters whose name or module path matches (repeatable)."),
    click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                 help="Training: micro-steps per optimizer step; the batch dim is divided by N."),
    click.option("--micro-batch", type=click.IntRange(min=1), default=None, metavar="M",
                 help="Training: the micro-batch size (the batch dim given with --dim is divided into steps of M)."),
    click.option("--checkpoint", default=None, metavar="K|auto",
                 help="Training: what-if of activation checkpointing in K segments, or auto (sqrt of the ops)."),
    click.option("--device", type=click.Choice(DEVICES), default="cuda", show_default=True,
                 help="Training: where PyTorch trains (dropout masks and the optimizer update differ)."),
    click.option("--loss", type=click.Choice(sorted(LOSSES)), default="cross_entropy", show_default=True,
                 help="Training: the loss after the model's first output."),
]


def training_click_options(command: Any) -> Any:
    """Add the training options (--training, --optimizer, --precision, ...) to a command."""
    for option in reversed(_TRAINING_OPTIONS):
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="onnxmem")
def main() -> None:
    """Static memory analysis of ONNX models: will it fit, and at what batch size?"""
    # A command is one short run that builds hundreds of thousands of small objects and no garbage cycles worth
    # collecting: the cyclic collector's scans cost 0.5 s of a 4.5 s report on a 100k-node graph (measured).
    gc.disable()


@main.command()
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE",
              help="Bind a symbolic dim, e.g. --dim batch=8 --dim seq=512 (repeatable).")
@click.option("--default-dim", type=click.IntRange(min=1), default=None, metavar="N",
              help="Bind every dim not given with --dim to N (a warning names them).")
@click.option("--order", type=click.Choice(list(ORDERS)), default=DEFAULT_ORDER, show_default=True,
              help=f"Execution order. {orders_help()}.")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="table", show_default=True,
              help=f"Output: {formats_help()}.")
@click.option("--provider", type=click.Choice(REPORT_PROVIDERS), default=DEFAULT_PROVIDER, show_default=True,
              help=PROVIDER_HELP)
@click.option("--timeline", "with_timeline", is_flag=True,
              help="JSON: add inference.timeline[] ({step, node, op_type, live_bytes} for every step: weights + "
                   "inputs + live activations, the series the plots draw), and training.timeline[] with "
                   "--training.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Rows in each table.")
@click.option("--plot", "plot_file", default=None, metavar="FILE.png|FILE.svg",
              help="Also draw the memory timeline, its peak marked (needs the extra 'plot': matplotlib).")
@training_click_options
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def report(model: str, dims: tuple[str, ...], default_dim: int | None, order: str, fmt: str, provider: str,
           with_timeline: bool, top: int, plot_file: str | None,
           training: bool, optimizer: str, precision: str, freeze: tuple[str, ...], train_only: tuple[str, ...],
           grad_accum: int, micro_batch: int | None, checkpoint: str | None, device: str, loss: str,
           debug: bool) -> None:
    """Report weights, inputs and the inference peak of activations of MODEL (and with --training, a step)."""

    def work() -> None:
        bound = parse_dims(dims)
        options = None
        if training:
            options = training_options(optimizer=optimizer, precision=precision, freeze=freeze,
                                       train=train_only, grad_accum=grad_accum, micro_batch=micro_batch,
                                       checkpoint=checkpoint, device=device, loss=loss)
        result = analyze(model, bound, default_dim=default_dim, order=order, training=options, provider=provider)
        if plot_file:
            from .plot import save_plot

            save_plot(plot_file, timeline=series_of(result))
        click.echo(FORMATS[fmt].report(result, top, with_timeline), nl=fmt != "html")

    _run(debug, work)


# --- fit and check: plan against a memory budget (onnxmem/plan.py) --------------------------------------------

EXIT_DOES_NOT_FIT = 1


def _plan_options(command: Any) -> Any:
    """Add the options fit and check share: the target, the binding, sharding, output."""
    options: list[Any] = [
        click.argument("model", type=click.Path(dir_okay=True, path_type=str)),
        click.option("--memory", "--budget", "memory", default=None, metavar="SIZE",
                     help="The memory to fit in: 24GiB, 16GB, 80000MB (GB = 10^9 bytes, GiB = 2^30)."),
        click.option("--gpu", default=None, metavar="NAME",
                     help="A GPU of the catalog (A100-80GB, H100-80GB, L4-24GB, ...; `onnxmem gpus` lists them)."),
        click.option("--runtime", type=click.Choice(sorted(RUNTIMES)), default=None,
                     help="Count this runtime's fixed costs and its allocator's rounding."),
        click.option("--reserve", default=None, metavar="SIZE",
                     help="Fixed costs taken off the memory before the model (replaces the stated defaults)."),
        click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic dim (repeatable)."),
        click.option("--default-dim", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Bind every other dim to N."),
        click.option("--order", type=click.Choice(list(ORDERS)), default=DEFAULT_ORDER, show_default=True,
                     help="Execution order (see `onnxmem report --help`)."),
        click.option("--provider", type=click.Choice(REPORT_PROVIDERS), default=DEFAULT_PROVIDER, show_default=True,
                     help=PROVIDER_HELP),
        click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                     help="Training: data-parallel GPUs; with --shard, model states are divided across them."),
        click.option("--shard", type=click.Choice(SHARD_STAGES), default=None,
                     help="Training: divide weights, gradients and optimizer states as ZeRO/FSDP do."),
        click.option("--what-if/--no-what-if", default=True, show_default=True,
                     help="Evaluate the single changes that would lower the peak."),
        click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="table", show_default=True,
                     help=f"Output: {formats_help()}."),
        click.option("--plot", "plot_file", default=None, metavar="FILE.png|FILE.svg",
                     help="Draw the timeline (and, for fit, memory against the dim) with the budget line."),
        training_click_options,
        click.option("--debug", is_flag=True, help="Show the traceback of an error."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@main.command()
@_plan_options
@click.option("--search", default="batch", show_default=True, metavar="DIM",
              help="The dim to search: batch, seq, ... (the other dims are bound with --dim).")
def fit(model: str, memory: str | None, gpu: str | None, runtime: str | None, reserve: str | None,
        dims: tuple[str, ...], default_dim: int | None, order: str, provider: str, gpus: int, shard: str | None,
        what_if: bool,
        fmt: str, plot_file: str | None, debug: bool, search: str, **training_flags: Any) -> None:
    """Find the largest batch (or --search DIM) of MODEL whose peak fits --memory SIZE or --gpu NAME."""

    def work() -> None:
        result = plan_fit(model, memory=memory, gpu=gpu, runtime=runtime, reserve=reserve, search=search,
                          dims=parse_dims(dims), default_dim=default_dim, order=order,
                          training=_training_from(training_flags), gpus=gpus, shard=shard, what_if=what_if,
                          provider=provider)
        timeline = series_of(result.report) if result.report is not None else None
        if plot_file:
            from .plot import save_plot

            save_plot(plot_file, timeline=timeline, fit=result, budget_bytes=result.budget_bytes)
        click.echo(FORMATS[fmt].fit(result), nl=fmt != "html")

    _run(debug, work)


@main.command()
@_plan_options
def check(model: str, memory: str | None, gpu: str | None, runtime: str | None, reserve: str | None,
          dims: tuple[str, ...], default_dim: int | None, order: str, provider: str, gpus: int, shard: str | None,
          what_if: bool,
          fmt: str, plot_file: str | None, debug: bool, **training_flags: Any) -> None:
    """Exit 0 when MODEL at its --dim values fits --budget SIZE (or --gpu NAME), 1 when it does not, 2 on bad input.

    With --format json, prints one JSON object (schema onnxmem.check/1).
    """
    fits = True

    def work() -> None:
        nonlocal fits
        bound = parse_dims(dims)
        result = plan_check(model, bound, memory=memory, gpu=gpu, runtime=runtime, reserve=reserve,
                            default_dim=default_dim, order=order, training=_training_from(training_flags),
                            gpus=gpus, shard=shard, what_if=what_if, provider=provider)
        timeline = series_of(result.report) if result.report is not None else None
        if plot_file:
            from .plot import save_plot

            save_plot(plot_file, timeline=timeline, budget_bytes=result.budget_bytes)
        click.echo(FORMATS[fmt].check(result), nl=fmt != "html")
        fits = result.fits

    _run(debug, work)
    if not fits:
        sys.exit(EXIT_DOES_NOT_FIT)


def _training_from(flags: dict[str, Any]) -> Any:
    flags = dict(flags)
    if not flags.pop("training"):
        return None
    flags["train"] = flags.pop("train_only")
    return training_options(**flags)


@main.command()
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic dim (repeatable).")
@click.option("--default-dim", type=click.IntRange(min=1), default=None, metavar="N",
              help="Bind every dim not given to N.")
@click.option("--provider", type=click.Choice(PROVIDERS), default="cpu", show_default=True,
              help="Where onnxruntime runs the model (cuda needs the gpu extra and an NVIDIA GPU).")
@click.option("--opt-level", type=click.Choice(OPT_LEVELS), default="disable", show_default=True,
              help="onnxruntime's graph optimization level; the estimate is made on the graph it ran.")
@click.option("--runs", type=click.IntRange(1, 100), default=2, show_default=True,
              help="Runs to measure: the first allocates tensor by tensor, later ones use the memory pattern.")
@click.option("--mem-pattern/--no-mem-pattern", default=True, show_default=True,
              help="onnxruntime's memory pattern (one planned block from the second run on).")
@click.option("--format", "fmt", type=click.Choice(validation_formats()), default="table", show_default=True)
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def validate(model: str, dims: tuple[str, ...], default_dim: int | None, provider: str, opt_level: str, runs: int,
             mem_pattern: bool, fmt: str, debug: bool) -> None:
    """Run MODEL in onnxruntime and compare its real allocations with the estimate, run by run."""

    def work() -> None:
        from .validate import validate as run_validation

        result = run_validation(model, parse_dims(dims), provider=provider, opt_level=opt_level, runs=runs,
                                mem_pattern=mem_pattern, default_dim=default_dim)
        click.echo(render_validation(result, fmt))

    _run(debug, work)


@main.command()
def gpus() -> None:
    """List the GPU catalog, the runtimes' fixed costs and their allocators (what --gpu and --runtime take)."""
    click.echo(render_targets())


if __name__ == "__main__":  # pragma: no cover
    main()

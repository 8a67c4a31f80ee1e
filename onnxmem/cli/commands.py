"""The onnxmem command: parse options, call the library, render, map errors to exit codes.

Exit codes: 0 success, 2 bad input (a one-line message on stderr), 3 an internal error (a bug: rerun
with --debug for the traceback).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from onnxmem.arguments import parse_dims  # (refuses a dim given twice)
from onnxmem.errors import OnnxMemError, TrainingOptionError, one_line, quoted
from onnxmem.measure.ort_cpu import OPT_LEVELS
from onnxmem.passes.orders import DEFAULT_ORDER, ORDERS, orders_help
from onnxmem.passes.pipeline import analysis, analyze
from onnxmem.targets.ort import DEFAULT_PROVIDER, PROVIDERS
from onnxmem.views.formats import FORMATS, JSON_FORMATS, error_document, formats_help, json_line, validation_formats
from onnxmem.views.render import json_text, render_targets, render_validation, targets_document
from onnxmem.views.series import series_of

EXIT_BAD_INPUT = 2
# What the command made and no longer reads: kept until the exit, which frees it at once (run: os._exit), where
# freeing a 100k-node analysis object by object is a measurable part of a report (in-process callers, as tests,
# keep only the last).
_KEPT: list[object] = []
REPORT_PROVIDERS = list(PROVIDERS)
PROVIDER_HELP = ("The onnxruntime execution provider the estimate assumes: cuda (a GPU's question: device memory, "
                 "with the shape subgraphs and the nodes without a CUDA kernel in host memory, as onnxruntime's "
                 "source places them) or cpu, whose missing float16 kernels make onnxruntime run float16 models "
                 "partly in float32, between Casts it inserts.")
EXIT_INTERNAL = 3
HF_HELP = ("MODEL is a Hugging Face transformers config.json (or the folder holding one): the model is built "
           "without weights and exported, nothing downloaded (needs torch and transformers), or made from a shipped "
           "graph template of its family where one applies (Llama, Mistral, Qwen2, Mixtral, Whisper: no torch; "
           "ONNXMEM_HF_TEMPLATES=off always exports).")
# (onnxmem.hf.TASKS, written here: the command line starts without importing onnxmem.hf)
HF_TASKS = ("causal-lm", "decode", "seq2seq", "speech-seq2seq", "classifier", "masked-lm", "vision")
HF_TASK_HELP = ("With --hf: what the model is exported for (default: its architecture's task). decode: a causal "
                "LM's serving step with its KV cache (inputs past_key_values.N.key/value [batch, kv_heads, past, "
                "head_dim], outputs logits and present.N.key/value): prefill at --dim past=0, decode at --dim seq=1.")


def run() -> None:
    """The console command: main(), then an exit that skips freeing the analysis object by object (the
    interpreter's teardown of a large graph, which a short command need not pay: every file was written and
    closed by then).

    SIGINT and SIGTERM end the command with one line and exit 130 or 143, after every `with` block on the way
    out has closed (validate's temporary folder is removed); a second signal ends it at once."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) != signal.SIG_IGN:  # (a background job of a shell ignores SIGINT: it still does)
            signal.signal(signum, _interrupt)
    try:
        code: Any = main(standalone_mode=False) or 0  # (click's own errors below: as JSON where JSON was asked)
    except click.ClickException as exc:
        code = _usage_error(exc)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        code = 1
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


def _usage_error(exc: click.ClickException) -> int:
    """Say an option click refused as click says it, and also as a JSON error object on stdout where the command
    line asked for --format json or jsonl (a pipeline that reads JSON always reads JSON); give the exit code."""
    arguments = sys.argv[1:]
    asked = [b for a, b in zip(arguments, arguments[1:], strict=False) if a == "--format"] + \
        [a.partition("=")[2] for a in arguments if a.startswith("--format=")]
    if any(fmt in ("json", "jsonl") for fmt in asked):
        click.echo(json_line(error_document("", exc, exc.format_message())))
    exc.show()
    return exc.exit_code


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


def _run(debug: bool, work: Any, fmt: str = "table", model: str = "") -> None:
    """Run a command's work, mapping errors to a one-line message on stderr and an exit code; with --format json or
    jsonl the error is also one JSON object on stdout (schema onnxmem.error/1)."""
    try:
        work()
    except OnnxMemError as exc:
        if debug:
            raise
        _error_json(fmt, model, exc)
        click.echo(f"onnxmem: error: {one_line(str(exc))}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except (KeyboardInterrupt, SystemExit, click.exceptions.Exit):
        raise
    except MemoryError as exc:
        if debug:
            raise
        message = "out of memory: the model needs more memory than this process may use"
        _error_json(fmt, model, exc, message)
        click.echo(f"onnxmem: error: {message}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except Exception as exc:
        if debug:
            raise
        text = one_line(" ".join(str(exc).split()), 300)
        _error_json(fmt, model, exc, f"{type(exc).__name__}: {text} (rerun with --debug and report it)")
        click.echo(f"onnxmem: internal error: {type(exc).__name__}: {text} (rerun with --debug and report it)",
                   err=True)
        sys.exit(EXIT_INTERNAL)


def _refuse_overwriting(option: str, output: str | None, model: str) -> None:
    """Raise where an output path (`option`'s) is a file the model is read from: the model or its external data
    (symlinks resolved; the same file by os.path.samefile where both exist): onnxmem never writes over its input."""
    if output is None:
        return
    from onnxmem.ir.load import input_files

    target = Path(output)
    for given, what in input_files(model):
        try:
            same = os.path.samefile(target, given) if target.exists() and given.exists() else \
                target.resolve() == given.resolve()
        except (OSError, RuntimeError):  # (RuntimeError: a symlink loop, Python < 3.13)
            same = False
        if same:
            raise OnnxMemError(f"{option} {quoted(output)} is {what}: onnxmem never writes over a file it reads; "
                               "give another path")


def _error_json(fmt: str, model: str, exc: BaseException, message: str | None = None) -> None:
    if fmt in JSON_FORMATS:
        document = error_document(model, exc, message)
        click.echo(json_line(document) if fmt == "jsonl" else json_text(document))


# --- progress on a terminal -------------------------------------------------------------------------------------

_PROGRESS_AFTER_S = 1.0  # a run shorter than this says nothing


class _Progress:
    """Says on stderr, on one line rewritten in place, what a run is doing, once it has run for a second (a timer
    shows the stage then under way); `clear` removes the line before an answer is written, `close` ends it."""

    def __init__(self, stream: Any, after_s: float = _PROGRESS_AFTER_S) -> None:
        self.stream = stream
        self.message = ""
        self.shown = False
        self.done = False
        self.lock = threading.Lock()
        self.start = time.monotonic()
        self.timer = threading.Timer(after_s, self._show)
        self.timer.daemon = True
        self.after_s = after_s
        self.timer.start()

    def __call__(self, message: str) -> None:
        with self.lock:
            self.message = message
        if time.monotonic() - self.start >= self.after_s:
            self._show()

    def _show(self) -> None:
        with self.lock:
            if self.done or not self.message:
                return
            self.stream.write(f"\r\033[Konnxmem: {self.message} ...")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        with self.lock:
            if self.shown:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self.shown = False

    def close(self) -> None:
        self.timer.cancel()
        self.clear()
        with self.lock:
            self.done = True


@contextlib.contextmanager
def _progress_line() -> Iterator[_Progress | None]:
    """Give the progress callback for this run (None where stderr is no terminal: a pipe, a file, a test), and
    clear its line when the run ends, before the answer or an error is written."""
    stream = sys.stderr
    progress = _Progress(stream) if stream is not None and stream.isatty() else None
    try:
        yield progress
    finally:
        if progress is not None:
            progress.close()


class _TableChoice(click.Choice[str]):
    """A click.Choice of a table's names, read at first need: a command without --training never imports the
    training step's modules and tables (start-up an inference report does not need). Click converts an option's
    default at every call; the default (one of the names: tests check it) is taken as it is, without the table."""

    def __init__(self, names: Callable[[], Iterable[str]], default: str | None = None) -> None:
        self._names = names
        self._choices: tuple[str, ...] | None = None
        self._default = default
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:
        if self._choices is None:
            self._choices = tuple(self._names())
        return self._choices

    @choices.setter
    def choices(self, names: Iterable[str]) -> None:
        self._choices = tuple(names)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if value is not None and value == self._default:
            return str(value)
        return super().convert(value, param, ctx)


def _module(name: str) -> Any:
    return importlib.import_module(name)


class _DeviceOptionHelp(click.Option):
    """--device-option, whose help lists each device's declared options (read when the help is shown)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None:
            return None
        devices = _module("onnxmem.targets.torch").DEVICES
        listed = "; ".join(
            f"{name}: " + (", ".join(f"{o.name}={'|'.join(o.choices()) if o.choices else o.kind.__name__.upper()} "
                                     f"({o.help})" for o in device.options) or "none")
            for name, device in devices.items())
        return record[0], f"{record[1]} {listed}."


# Training options, shared by report, fit and check.
_TRAINING_OPTIONS = [
    click.option("--training", is_flag=True, help="Also report the memory of one training step."),
    click.option("--optimizer", default="adamw",
                 type=_TableChoice(lambda: sorted([*_module("onnxmem.training.rules").OPTIMIZERS,
                                                   *_module("onnxmem.training.rules").OPTIMIZER_ALIASES]), "adamw"),
                 show_default=True, help="Training: the optimizer (sgd-momentum, adam8bit, ...)."),
    click.option("--precision", type=_TableChoice(lambda: _module("onnxmem.training.options").PRECISIONS, "fp32"),
                 default="fp32",
                 show_default=True,
                 help="Training: fp32, autocast mixed precision with fp32 master weights, or pure bf16."),
    click.option("--freeze", multiple=True, metavar="PATTERN",
                 help="Training: freeze parameters whose name or module path matches (fnmatch; repeatable)."),
    click.option("--train", "train_only", multiple=True, metavar="PATTERN",
                 help="Training: train only parameters whose name or module path matches (repeatable)."),
    click.option("--lora", is_flag=True,
                 help="Training: train only the LoRA adapters (PEFT's parameters named *.lora_*: lora_A, lora_B), "
                      "the base frozen; with --hf, adapters of PEFT's default LoraConfig (rank 8) are added."),
    click.option("--base-precision", type=_TableChoice(lambda: _module("onnxmem.training.options").BASE_PRECISIONS),
                 default=None, metavar="nf4|fp4|nf4-no-double-quant|int8",
                 help="Training: store the frozen Linear weights as bitsandbytes does (QLoRA: nf4 with double "
                      "quantization; int8: LLM.int8), dequantized per layer while it runs (the lm_head stays)."),
    click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                 help="Training: micro-steps per optimizer step; the batch dim is divided by N."),
    click.option("--micro-batch", type=click.IntRange(min=1), default=None, metavar="M",
                 help="Training: the micro-batch size (the batch dim given with --dim is divided into steps of M)."),
    click.option("--checkpoint", default=None, metavar="K|auto|layers",
                 help="Training: what-if of activation checkpointing in K segments, or auto (sqrt of the ops); "
                      "layers: the step with each repeated block checkpointed, as transformers' "
                      "gradient_checkpointing_enable() and timm's set_grad_checkpointing() train it; "
                      "layers:PATTERN,...: the numbered module levels named (layers:stages)."),
    click.option("--device", type=_TableChoice(lambda: list(_module("onnxmem.targets.torch").DEVICES), "cuda"),
                 default="cuda",
                 show_default=True,
                 help="Training: where PyTorch trains (dropout masks and the optimizer update differ)."),
    click.option("--loss", type=_TableChoice(lambda: sorted(_module("onnxmem.training.rules").LOSSES), "cross_entropy"),
                 default="cross_entropy", show_default=True,
                 help="Training: the loss after the model's first output."),
    click.option("--device-option", "device_options", multiple=True, metavar="KEY=VALUE", cls=_DeviceOptionHelp,
                 help="Training: an option of the --device (repeatable); each device declares its own:"),
    # the CPU's options by their names before --device-option (kept so older command lines run): hidden
    click.option("--cpu-threads", type=click.IntRange(min=1), default=None, hidden=True),
    click.option("--cpu-isa", type=_TableChoice(lambda: sorted(_module("onnxmem.targets.torch.cpu.tables").CPU_ISAS)),
                 default=None, hidden=True),
]
# The hidden aliases above: flag -> (the device that takes it, its option's name there).
_DEVICE_OPTION_ALIASES = {"cpu_threads": ("cpu", "threads"), "cpu_isa": ("cpu", "isa")}


def _device_options(device: str, given: tuple[str, ...], **aliases: Any) -> dict[str, object]:
    """Give the device options of --device-option KEY=VALUE and the aliases given (checked against the device's
    declared options when the device is made); an alias of another device's option is a TrainingOptionError."""
    options: dict[str, object] = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TrainingOptionError(f"--device-option '{item}': expected KEY=VALUE")
        options[key.strip()] = value.strip()
    for flag, value in aliases.items():
        if value is None:
            continue
        owner, name = _DEVICE_OPTION_ALIASES[flag]
        if owner != device:
            raise TrainingOptionError(f"--{flag.replace('_', '-')} is an option of --device {owner}, not of "
                                      f"--device {device}")
        options[name] = value
    return options


def _training_values(flags: dict[str, Any]) -> dict[str, Any]:
    """Give training_options' arguments from the training flags: the device options gathered."""
    flags = dict(flags)
    flags["base_precision"] = flags.get("base_precision") or ""  # (not given: the weights as exported)
    aliases = {flag: flags.pop(flag) for flag in _DEVICE_OPTION_ALIASES}
    flags["device_options"] = _device_options(flags["device"], flags.pop("device_options"), **aliases)
    return flags


def training_click_options(command: Any) -> Any:
    """Add the training options (--training, --optimizer, --precision, ...) to a command."""
    for option in reversed(_TRAINING_OPTIONS):
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
The three questions, one command each:
  how much memory, and where?  onnxmem report model.onnx --dim batch=8 --dim seq=512
  what batch fits my GPU?      onnxmem fit model.onnx --gpu A100-80GB --dim seq=512
  does it fit this budget?     onnxmem check model.onnx --dim batch=8 --dim seq=512 --budget 16GiB
Shell completion (bash, in ~/.bashrc; README: zsh and fish):
  eval "$(_ONNXMEM_COMPLETE=bash_source onnxmem)"
""")
@click.version_option(package_name="onnxmem")
def main() -> None:
    """Static memory analysis of ONNX models: will it fit, and at what batch size?"""
    # A command is one short run that builds hundreds of thousands of small objects and no garbage cycles worth
    # collecting: the cyclic collector's scans were a tenth of a report on a 100k-node graph (BENCHMARKS.md).
    gc.disable()


@main.command(epilog="""\b
Examples:
  onnxmem report model.onnx --dim batch=8 --dim seq=512
  onnxmem report models/ --default-dim 1 --format jsonl --jobs 2   (every *.onnx of models/, one line each)""")
@click.argument("models", nargs=-1, required=True, metavar="MODEL...",
                type=click.Path(dir_okay=True, path_type=str))
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
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Several models: analyse N at once in a pool of processes (1: one after another, in this one).")
@click.option("--hf", is_flag=True, help=HF_HELP)
@click.option("--hf-task", type=click.Choice(HF_TASKS), default=None, help=HF_TASK_HELP)
@training_click_options
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def report(models: tuple[str, ...], dims: tuple[str, ...], default_dim: int | None, order: str, fmt: str,
           provider: str, with_timeline: bool, top: int, plot_file: str | None, jobs: int, hf: bool,
           hf_task: str | None, training: bool, optimizer: str, precision: str, freeze: tuple[str, ...],
           train_only: tuple[str, ...], lora: bool, base_precision: str | None, grad_accum: int,
           micro_batch: int | None, checkpoint: str | None,
           device: str, loss: str, device_options: tuple[str, ...], cpu_threads: int | None, cpu_isa: str | None,
           debug: bool) -> None:
    """Report weights, inputs and the inference peak of activations of each MODEL (a file, or a directory: its
    *.onnx files), and with --training, of a training step."""
    paths: list[str] = []
    request: dict[str, Any] = {}

    def prepare() -> None:
        _check_training_flags(training)
        paths.extend(_hf_files(models, training, lora, hf_task) if hf else
                     _model_paths(_refuse_hf_task(hf_task, models)))
        options = None
        if training:
            from onnxmem.training.step import training_options

            options = training_options(**_training_values(dict(
                optimizer=optimizer, precision=precision, freeze=freeze, train=train_only, lora=lora,
                base_precision=base_precision, grad_accum=grad_accum,
                micro_batch=micro_batch, checkpoint=checkpoint, device=device, loss=loss,
                device_options=device_options, cpu_threads=cpu_threads, cpu_isa=cpu_isa)))
        request.update(dims=parse_dims(dims), default_dim=default_dim, order=order, training=options,
                       provider=provider, fmt=fmt, top=top, timeline=with_timeline)
        if len(paths) > 1:
            for option, given, why in (("--format json", fmt == "json", "use --format jsonl: one object a line"),
                                       ("--format html", fmt == "html", "one page is one model"),
                                       ("--plot", bool(plot_file), "one picture is one model")):
                if given:
                    raise OnnxMemError(f"{option} takes one model, and {len(paths)} were given: {why}")

    _run(debug, prepare, fmt, models[0] if len(models) == 1 else "")
    if len(paths) > 1:
        sys.exit(_report_many(paths, request, jobs, debug))

    def work() -> None:
        _refuse_overwriting("--plot", plot_file, paths[0])
        with _progress_line() as progress:
            analysed = analysis(paths[0], request["dims"], default_dim=default_dim, order=order,
                                training=request["training"], provider=provider, progress=progress)
            _KEPT[:] = [analysed]  # freed by the exit (see run), not object by object here (the last one only)
            result = analysed.report
            if plot_file:
                from onnxmem.views.plot import save_plot

                save_plot(plot_file, timeline=series_of(result))
            text = FORMATS[fmt].report(result, top, with_timeline)
        click.echo(text, nl=fmt != "html")

    _run(debug, work, fmt, paths[0])


def _hf_files(configs: Iterable[str], training: bool, lora: bool, task: str | None = None) -> list[str]:
    """Give the export of each Hugging Face config (onnxmem.hf.exported: weights as a sparse file, train mode with
    --training, for --hf-task), from the export cache or in temporary folders removed when the command ends."""
    from onnxmem.hf import LORA_RANK, exported

    context = click.get_current_context()
    return [str(context.with_resource(exported(config, training=training, lora=LORA_RANK if lora else None,
                                               task=task)).path)
            for config in configs]


def _refuse_hf_task(task: str | None, models: Any) -> Any:
    """Give `models` as they are where no --hf-task was given (it needs --hf); raise OnnxMemError otherwise."""
    if task is not None:
        raise OnnxMemError("--hf-task takes --hf (MODEL a transformers config.json)")
    return models


def _model_paths(arguments: tuple[str, ...]) -> list[str]:
    """Give the models named on the command line: each file as given, each directory's *.onnx files, sorted."""
    paths: list[str] = []
    for argument in arguments:
        if os.path.isdir(argument):
            found = sorted(os.path.join(argument, name) for name in os.listdir(argument)
                           if name.endswith(".onnx") and os.path.isfile(os.path.join(argument, name)))
            if not found:
                raise OnnxMemError(f"{one_line(argument)}: is a directory with no .onnx file in it")
            paths += found
        else:
            paths.append(argument)
    return paths


def _report_many(paths: list[str], request: dict[str, Any], jobs: int, debug: bool) -> int:
    """Write the report of each model in turn (in a pool of `jobs` processes when jobs > 1) and give the exit code:
    0, or the worst of the models' (2: bad input, 3: internal error). A model's error does not stop the others: it
    is one JSON object in jsonl, a line on stderr otherwise."""
    worst = 0
    with contextlib.ExitStack() as stack:
        progress = stack.enter_context(_progress_line())
        if jobs == 1:
            results: Iterator[tuple[str, str, int]] = (_report_one(path, request, debug) for path in paths)
        else:
            import concurrent.futures
            import itertools

            pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(paths))))
            stack.callback(pool.shutdown, cancel_futures=True)  # on an interruption: drop the models not begun
            results = pool.map(_report_one, paths, itertools.repeat(request), itertools.repeat(False))
        for index, path in enumerate(paths):
            if progress is not None:
                progress(f"model {index + 1} of {len(paths)}: {path}")
            out, err, code = next(results)
            if progress is not None:
                progress.clear()
            if out:
                click.echo(out + ("" if request["fmt"] == "jsonl" or index == len(paths) - 1 else "\n"))
            if err:
                click.echo(err, err=True)
            worst = max(worst, code)
    return worst


def _report_one(path: str, request: dict[str, Any], debug: bool = False) -> tuple[str, str, int]:
    """Give one model's report in the requested format, or its error, as (stdout text, stderr line, exit code): the
    work of one model of `onnxmem report a.onnx b.onnx ...`, in this process or in a pool's worker."""
    fmt = request["fmt"]
    try:
        result = analyze(path, request["dims"], default_dim=request["default_dim"], order=request["order"],
                         training=request["training"], provider=request["provider"])
        return FORMATS[fmt].report(result, request["top"], request["timeline"]), "", 0
    except OnnxMemError as exc:
        if debug:
            raise
        error: BaseException = exc
        message, line, code = None, f"onnxmem: error: {path}: {one_line(str(exc))}", EXIT_BAD_INPUT
    except MemoryError as exc:
        if debug:
            raise
        error, message = exc, "out of memory: the model needs more memory than this process may use"
        line, code = f"onnxmem: error: {path}: {message}", EXIT_BAD_INPUT
    except Exception as exc:
        if debug:
            raise
        error = exc
        text = one_line(" ".join(str(exc).split()), 300)
        message = f"{type(exc).__name__}: {text} (rerun with --debug and report it)"
        line, code = f"onnxmem: internal error: {path}: {message}", EXIT_INTERNAL
    return (json_line(error_document(path, error, message)) if fmt == "jsonl" else ""), line, code


_TRAINING_ONLY = ("optimizer", "precision", "freeze", "train_only", "grad_accum", "micro_batch", "checkpoint",
                  "device", "loss", "device_options", "cpu_threads", "cpu_isa", "lora", "base_precision")


def _check_training_flags(training: bool) -> None:
    """Raise where a training option was given on the command line (not left at its default) without --training:
    it would change nothing."""
    if training:
        return
    context = click.get_current_context()
    flags = {p.name: p.opts[0] for p in context.command.params}
    given = [flags[name] for name in _TRAINING_ONLY
             if context.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)]
    if given:
        what = f"{given[0]} is a training option" if len(given) == 1 else f"{', '.join(given)} are training options"
        raise TrainingOptionError(f"{what}: add --training (without it, only inference is reported)")

# --- fit and check: plan against a memory budget (onnxmem/plan/fit.py) -------------------------------------------

EXIT_DOES_NOT_FIT = 1


def _plan_options(command: Any) -> Any:
    """Add the options fit and check share: the target, the binding, sharding, output."""
    options: list[Any] = [
        click.argument("model", type=click.Path(dir_okay=True, path_type=str)),
        click.option("--memory", "--budget", "memory", default=None, metavar="SIZE",
                     help="The memory to fit in: 24GiB, 16GB, 80000MB (GB = 10^9 bytes, GiB = 2^30)."),
        click.option("--gpu", default=None, metavar="NAME",
                     help="A GPU of the catalog (A100-80GB, H100-80GB, L4-24GB, ...; `onnxmem gpus` lists them)."),
        click.option("--runtime", type=_TableChoice(lambda: sorted(_module("onnxmem.plan.fit").RUNTIMES)), default=None,
                     help="Count this runtime's fixed costs and its allocator's rounding."),
        click.option("--reserve", default=None, metavar="SIZE",
                     help="Fixed costs taken off the memory before the model (replaces the stated defaults)."),
        click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic dim (repeatable)."),
        click.option("--default-dim", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Bind every other dim to N."),
        click.option("--order", type=click.Choice(list(ORDERS)), default=DEFAULT_ORDER, show_default=True,
                     help=f"Execution order. {orders_help()}."),
        click.option("--provider", type=click.Choice(REPORT_PROVIDERS), default=DEFAULT_PROVIDER, show_default=True,
                     help=PROVIDER_HELP),
        click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                     help="Training: data-parallel GPUs; with --shard, model states are divided across them."),
        click.option("--shard", type=_TableChoice(lambda: _module("onnxmem.plan.fit").SHARD_STAGES), default=None,
                     help="Training: divide weights, gradients and optimizer states as ZeRO/FSDP do."),
        click.option("--offload", type=click.Choice(["none", "optimizer", "params", "both"]), default="none",
                     show_default=True, help="Sharded training: keep the optimizer states (optimizer), the "
                     "parameters (params: zero3, fsdp) or both in CPU memory, as DeepSpeed's offload does."),
        click.option("--hf", is_flag=True, help=HF_HELP),
        click.option("--hf-task", type=click.Choice(HF_TASKS), default=None, help=HF_TASK_HELP),
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


@main.command(epilog="""\b
Examples:
  onnxmem fit model.onnx --gpu A100-80GB --runtime pytorch --dim seq=2048
  onnxmem fit model.onnx --memory 24GiB --training --grad-accum 4 --dim seq=512   (batch in multiples of 4)""")
@_plan_options
@click.option("--search", default="batch", show_default=True, metavar="DIM",
              help="The dim to search: batch, seq, ... (the other dims are bound with --dim); gpus: the fewest "
              "GPUs that fit sharded training (--shard).")
def fit(model: str, memory: str | None, gpu: str | None, runtime: str | None, reserve: str | None,
        dims: tuple[str, ...], default_dim: int | None, order: str, provider: str, gpus: int, shard: str | None,
        offload: str, hf: bool, hf_task: str | None, what_if: bool,
        fmt: str, plot_file: str | None, debug: bool, search: str, **training_flags: Any) -> None:
    """Find the largest batch (or --search DIM) of MODEL whose peak fits --memory SIZE or --gpu NAME."""

    def work() -> None:
        nonlocal model
        model = _hf_files([model], training_flags["training"], training_flags["lora"], hf_task)[0] if hf else \
            _refuse_hf_task(hf_task, model)
        _refuse_overwriting("--plot", plot_file, model)
        from onnxmem.plan.fit import fit as plan_fit  # (fit's and check's modules: start-up a report does not need

        with _progress_line() as progress:
            result = plan_fit(model, memory=memory, gpu=gpu, runtime=runtime, reserve=reserve, search=search,
                              dims=parse_dims(dims), default_dim=default_dim, order=order,
                              training=_training_from(training_flags), gpus=gpus, shard=shard, what_if=what_if,
                              provider=provider, progress=progress, offload=offload)
            if progress is not None:
                progress(f"the report at {search}={max(result.max_value, result.step)}")
            timeline = series_of(result.report) if result.report is not None else None
            if plot_file:
                from onnxmem.views.plot import save_plot

                save_plot(plot_file, timeline=timeline, fit=result, budget_bytes=result.budget_bytes)
            text = FORMATS[fmt].fit(result)
        click.echo(text, nl=fmt != "html")

    _run(debug, work, fmt, model)


@main.command(epilog="""\b
Example (a CI gate: exit 1 when it does not fit):
  onnxmem check model.onnx --dim batch=32 --dim seq=512 --budget 16GiB --runtime onnxruntime --format json""")
@_plan_options
def check(model: str, memory: str | None, gpu: str | None, runtime: str | None, reserve: str | None,
          dims: tuple[str, ...], default_dim: int | None, order: str, provider: str, gpus: int, shard: str | None,
          offload: str, hf: bool, hf_task: str | None, what_if: bool,
          fmt: str, plot_file: str | None, debug: bool, **training_flags: Any) -> None:
    """Exit 0 when MODEL at its --dim values fits --budget SIZE (or --gpu NAME), 1 when it does not, 2 on bad input.

    With --format json, prints one JSON object (schema onnxmem.check/1).
    """
    fits = True

    def work() -> None:
        nonlocal fits, model
        model = _hf_files([model], training_flags["training"], training_flags["lora"], hf_task)[0] if hf else \
            _refuse_hf_task(hf_task, model)
        _refuse_overwriting("--plot", plot_file, model)
        from onnxmem.plan.fit import check as plan_check

        bound = parse_dims(dims)
        with _progress_line() as progress:
            result = plan_check(model, bound, memory=memory, gpu=gpu, runtime=runtime, reserve=reserve,
                                default_dim=default_dim, order=order, training=_training_from(training_flags),
                                gpus=gpus, shard=shard, what_if=what_if, provider=provider, progress=progress,
                                offload=offload)
            timeline = series_of(result.report) if result.report is not None else None
            if plot_file:
                from onnxmem.views.plot import save_plot

                save_plot(plot_file, timeline=timeline, budget_bytes=result.budget_bytes, verdict=result.arithmetic)
            text = FORMATS[fmt].check(result)
        click.echo(text, nl=fmt != "html")
        fits = result.fits

    _run(debug, work, fmt, model)
    if not fits:
        sys.exit(EXIT_DOES_NOT_FIT)


def _training_from(flags: dict[str, Any]) -> Any:
    flags = dict(flags)
    _check_training_flags(flags["training"])
    if not flags.pop("training"):
        return None
    flags["train"] = flags.pop("train_only")
    from onnxmem.training.step import training_options

    return training_options(**_training_values(flags))


@main.command(epilog="""\b
Example (needs the extra 'cpu': onnxruntime):
  onnxmem validate model.onnx --dim batch=8 --dim seq=32 --opt-level extended""")
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("--dim", "dims", multiple=True, metavar="NAME=VALUE", help="Bind a symbolic dim (repeatable).")
@click.option("--default-dim", type=click.IntRange(min=1), default=None, metavar="N",
              help="Bind every dim not given to N.")
@click.option("--provider", type=click.Choice(REPORT_PROVIDERS), default="cpu", show_default=True,
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
        from onnxmem.measure.validate import validate as run_validation

        result = run_validation(model, parse_dims(dims), provider=provider, opt_level=opt_level, runs=runs,
                                mem_pattern=mem_pattern, default_dim=default_dim)
        click.echo(render_validation(result, fmt))

    _run(debug, work, fmt, model)


@main.command(epilog="""\b
Example:
  onnxmem gpus --format json""")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output: table, or one JSON document (schema onnxmem.targets/1).")
def gpus(fmt: str) -> None:
    """List the GPU catalog, the runtimes' fixed costs and their allocators (what --gpu and --runtime take)."""
    click.echo(json_text(targets_document()) if fmt == "json" else render_targets())


if __name__ == "__main__":  # pragma: no cover
    main()

"""Build a zoo of real exported ONNX models (architectures the project did not write) to measure onnxmem on.

    python benchmarks/zoo.py [--out DIR] [--only NAME ...] [--list]

Each model is built from its library's config classes at a small size with random weights (torch.manual_seed(0)),
never downloaded (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1): torchvision and timm vision models at 64x64, and
Hugging Face transformers (BERT, GPT-2, Llama, T5 encoder) at 2 layers, hidden 64, vocab 1000. Each is exported with
both of torch's exporters (dynamo and TorchScript) with named dynamic dims: `batch`, and `seq` for text models.
Derived variants come from onnxruntime's and onnxconverter-common's tools: dynamic int8 quantization, static QDQ
quantization (random calibration data), fp16 conversion and onnxruntime.transformers' fusions (com.microsoft ops).

Files go to DIR (default ~/.cache/onnxmem-zoo), with DIR/zoo.json listing every model built: name, file, kind,
exporter, source (the model a derived one is made from), the dims to bind, and the seconds one onnxruntime run took
at those dims. A file already there is not built again (delete it to rebuild). A model that fails to build, or that
onnxruntime cannot run, is reported on one line and left out; the other models are still built.

Needs torch 2.13.0 (CPU), torchvision (used through shared/tools/tvshim.py), timm, transformers, onnxscript and
onnxconverter-common; onnxruntime for the derived models and the check run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

DEFAULT_OUT = Path.home() / ".cache" / "onnxmem-zoo"
REPO = Path(__file__).resolve().parents[1]
# shared/tools beside the checkout (../shared/tools), else the project's /work/shared/tools (a worktree elsewhere)
SHIM_DIR = next((d for d in (Path(__file__).resolve().parents[2] / "shared" / "tools", Path("/work/shared/tools"))
                 if (d / "tvshim.py").is_file()), Path(__file__).resolve().parents[2] / "shared" / "tools")
INDEX = "zoo.json"
SCHEMA = "onnxmem-zoo/1"
BATCH = 8  # the batch zoo.json binds
SEQ = 32  # the sequence length zoo.json binds
IMAGE = 64  # height and width of the vision models' inputs
VOCAB = 1000
MAX_POSITIONS = 128
VISION_DIMS = {"batch": BATCH}
TEXT_DIMS = {"batch": BATCH, "seq": SEQ}
EXPORTERS = {"dynamo": True, "ts": False}  # name suffix -> torch.onnx.export(dynamo=...)

Builder = Callable[[Path, Path], None]  # (file to write, zoo folder) -> None


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo and how to build it."""

    name: str
    kind: str  # torchvision, timm, transformers, quantize-dynamic, quantize-qdq, fp16, ort-fusion
    exporter: str  # dynamo, torchscript, or for a derived model its source's exporter
    dims: dict[str, int]
    build: Builder = field(repr=False)
    source: str | None = None  # the zoo model a derived one is made from
    tool: str = ""  # what made a derived model

    @property
    def file(self) -> str:
        """Give the file name of the model in the zoo folder."""
        return f"{self.name}.onnx"


class SkipModel(Exception):
    """A model that cannot be built here, with the reason."""


# ---------------------------------------------------------------------------------------------------------------
# Importing the libraries

def import_torchvision() -> Any:
    """Import torchvision through the shim that lets the PyPI wheel load on torch 2.13.0+cpu."""
    load_shim()
    import torchvision

    return torchvision


def load_shim() -> None:
    """Import shared/tools/tvshim.py (before torchvision and transformers), or stop with what is missing."""
    if "tvshim" in sys.modules:
        return
    if not (SHIM_DIR / "tvshim.py").is_file():
        raise SystemExit(f"zoo: {SHIM_DIR / 'tvshim.py'} is missing: the PyPI torchvision wheel does not load on "
                         "torch 2.13.0+cpu without it (it defines torchvision's nms ops)")
    sys.path.insert(0, str(SHIM_DIR))
    import tvshim  # noqa: F401  # registers torchvision's C++ ops before torchvision is imported


# ---------------------------------------------------------------------------------------------------------------
# Exporting torch modules

@dataclass(frozen=True)
class Exportable:
    """A torch module with example inputs and the names of their dynamic axes."""

    module: Any  # torch.nn.Module
    inputs: tuple[Any, ...]  # example tensors, positional
    input_names: tuple[str, ...]
    input_axes: tuple[dict[int, str], ...]  # for each input: axis -> dim name
    output_names: tuple[str, ...]
    output_axes: tuple[dict[int, str], ...]


def export(make: Callable[[], Exportable], dynamo: bool) -> Builder:
    """Give a builder exporting the module `make` gives with torch's dynamo or TorchScript exporter."""

    def build(path: Path, _out: Path) -> None:
        import torch

        torch.manual_seed(0)
        item = make()
        item.module.eval()
        names = {name for axes in item.input_axes for name in axes.values()}
        if dynamo:
            dims = {name: torch.export.Dim(name, min=1, max=MAX_POSITIONS if name == "seq" else 4096)
                    for name in names}
            # no_grad: with gradients on, the decomposition fails on T5's attention (a view of a transposed
            # tensor with a symbolic seq).
            with torch.no_grad():
                torch.onnx.export(item.module, item.inputs, str(path), dynamo=True, external_data=False,
                                  input_names=list(item.input_names), output_names=list(item.output_names),
                                  dynamic_shapes=tuple({axis: dims[name] for axis, name in axes.items()}
                                                       for axes in item.input_axes))
        else:
            # Gradients on: under no_grad, nn.MultiheadAttention in eval mode takes its fast path
            # (aten::_native_multi_head_attention), which the TorchScript exporter cannot export.
            axes = dict(zip(item.input_names + item.output_names, item.input_axes + item.output_axes, strict=True))
            torch.onnx.export(item.module, item.inputs, str(path), dynamo=False, opset_version=17,
                              input_names=list(item.input_names), output_names=list(item.output_names),
                              dynamic_axes=axes)

    return build


def vision(module: Callable[[], Any]) -> Callable[[], Exportable]:
    """Give the exportable of an image classifier built by `module`, input (batch, 3, IMAGE, IMAGE)."""

    def make() -> Exportable:
        import torch

        return Exportable(module(), (torch.randn(2, 3, IMAGE, IMAGE),), ("pixel_values",), ({0: "batch"},),
                          ("logits",), ({0: "batch"},))

    return make


def text(model: Callable[[], Any]) -> Callable[[], Exportable]:
    """Give the exportable of a Hugging Face model built by `model`: input_ids and attention_mask (batch, seq) in,
    its first output (hidden states or logits, (batch, seq, ...)) out."""

    def make() -> Exportable:
        import torch

        class FirstOutput(torch.nn.Module):
            """The model with its first output only (no cache, no dict)."""

            def __init__(self, inner: torch.nn.Module) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
                return self.inner(input_ids=input_ids, attention_mask=attention_mask)[0]

        ids = torch.randint(0, VOCAB, (2, 16))
        mask = torch.ones(2, 16, dtype=torch.int64)
        axes = {0: "batch", 1: "seq"}
        return Exportable(FirstOutput(model()), (ids, mask), ("input_ids", "attention_mask"), (axes, axes),
                          ("output",), (axes,))

    return make


# ---------------------------------------------------------------------------------------------------------------
# The models

def tv_resnet18() -> Any:
    """torchvision ResNet-18 (1000 classes)."""
    return import_torchvision().models.resnet18()


def tv_mobilenet_v3_small() -> Any:
    """torchvision MobileNetV3-Small (1000 classes)."""
    return import_torchvision().models.mobilenet_v3_small()


def tv_efficientnet_b0() -> Any:
    """torchvision EfficientNet-B0 (1000 classes)."""
    return import_torchvision().models.efficientnet_b0()


def tv_vit() -> Any:
    """torchvision VisionTransformer: 64x64 images, 16x16 patches, 2 layers, hidden 64, 4 heads, 10 classes."""
    models = import_torchvision().models
    return models.VisionTransformer(image_size=IMAGE, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64,
                                    mlp_dim=128, num_classes=10)


def timm_model(name: str, **kwargs: Any) -> Callable[[], Any]:
    """Give a builder of timm's model `name` with random weights and the given overrides."""

    def build() -> Any:
        load_shim()
        import timm

        return timm.create_model(name, pretrained=False, **kwargs)

    return build


def hf_bert() -> Any:
    """BertModel: 2 layers, hidden 64, 4 heads, eager attention (the pattern onnxruntime's bert optimizer fuses
    into Attention; the other text models keep transformers' default, SDPA)."""
    import transformers

    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS))
    model.set_attn_implementation("eager")
    return model


def hf_gpt2() -> Any:
    """GPT2LMHeadModel: 2 layers, hidden 64, 4 heads, no cache."""
    import transformers

    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=MAX_POSITIONS, use_cache=False,
        bos_token_id=0, eos_token_id=0))


def hf_llama() -> Any:
    """LlamaForCausalLM: 2 layers, hidden 64, 4 heads (2 key/value heads: grouped-query attention), no cache."""
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS, use_cache=False, bos_token_id=0,
        eos_token_id=0))


def hf_t5_encoder() -> Any:
    """T5EncoderModel: 2 layers, d_model 64, 4 heads, relative position buckets."""
    import transformers

    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4))


def hf_model(make: Callable[[], Any]) -> Callable[[], Any]:
    """Give `make` with the shim loaded first (transformers imports torchvision where it is installed)."""

    def build() -> Any:
        load_shim()
        return make()

    return build


VISION: dict[str, tuple[str, Callable[[], Any]]] = {
    "tv-resnet18": ("torchvision", tv_resnet18),
    "tv-mobilenet-v3-small": ("torchvision", tv_mobilenet_v3_small),
    "tv-efficientnet-b0": ("torchvision", tv_efficientnet_b0),
    "tv-vit": ("torchvision", tv_vit),
    "timm-convnext": ("timm", timm_model("convnext_atto", num_classes=10, depths=(1, 1, 2, 1))),
    "timm-resnet10t": ("timm", timm_model("resnet10t", num_classes=10)),
    "timm-vit": ("timm", timm_model("vit_tiny_patch16_224", img_size=IMAGE, depth=2, num_classes=10)),
}
TEXT: dict[str, Callable[[], Any]] = {
    "hf-bert": hf_model(hf_bert),
    "hf-gpt2": hf_model(hf_gpt2),
    "hf-llama": hf_model(hf_llama),
    "hf-t5-encoder": hf_model(hf_t5_encoder),
}


# ---------------------------------------------------------------------------------------------------------------
# Derived models: onnxruntime's and onnxconverter-common's tools on a zoo model

def quantize_dynamic(source: str) -> Builder:
    """Give a builder of the dynamic int8 quantization (MatMul weights) of zoo model `source`."""

    def build(path: Path, out: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(out / f"{source}.onnx", path, weight_type=QuantType.QInt8)

    return build


def quantize_qdq(source: str, dims: dict[str, int]) -> Builder:
    """Give a builder of the static QDQ int8 quantization of zoo model `source`, calibrated on random inputs."""

    def build(path: Path, out: Path) -> None:
        import onnx
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        model = onnx.load(str(out / f"{source}.onnx"), load_external_data=False)
        batches = [random_feeds(model, {**dims, "batch": 2}, seed) for seed in range(4)]

        class RandomReader(CalibrationDataReader):
            """Four random batches of two."""

            def __init__(self) -> None:
                self.left = iter(batches)

            def get_next(self) -> dict[str, Any] | None:
                return next(self.left, None)

        quantize_static(out / f"{source}.onnx", path, RandomReader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)

    return build


def fp16(source: str) -> Builder:
    """Give a builder of the fp16 conversion of zoo model `source` (inputs and outputs kept fp32)."""

    def build(path: Path, out: Path) -> None:
        import onnx
        from onnxconverter_common.float16 import convert_float_to_float16

        model = onnx.load(str(out / f"{source}.onnx"))
        onnx.save(convert_float_to_float16(model, keep_io_types=True), str(path))

    return build


def ort_fusion(source: str, model_type: str) -> Builder:
    """Give a builder of onnxruntime.transformers' optimizer on zoo model `source` (its python fusions only: the
    fused com.microsoft Attention, SkipLayerNormalization, BiasGelu... ops; onnxruntime's own passes are left to
    the session)."""

    def build(path: Path, out: Path) -> None:
        from onnxruntime.transformers.optimizer import optimize_model

        optimized = optimize_model(str(out / f"{source}.onnx"), model_type=model_type, num_heads=4, hidden_size=64,
                                   opt_level=0, use_gpu=False)
        fused = {n.op_type for n in optimized.model.graph.node if n.domain == "com.microsoft"}
        if not fused:
            raise SkipModel(f"the {model_type} optimizer fused nothing on {source}")
        optimized.save_model_to_file(str(path))

    return build


def zoo_models() -> list[ZooModel]:
    """Give every model of the zoo, sources before the models derived from them."""
    models: list[ZooModel] = []
    for name, (kind, module) in VISION.items():
        for suffix, dynamo in EXPORTERS.items():
            models.append(ZooModel(f"{name}-{suffix}", kind, exporter_name(dynamo), dict(VISION_DIMS),
                                   export(vision(module), dynamo)))
    for name, model in TEXT.items():
        for suffix, dynamo in EXPORTERS.items():
            models.append(ZooModel(f"{name}-{suffix}", "transformers", exporter_name(dynamo), dict(TEXT_DIMS),
                                   export(text(model), dynamo)))
    exporter = {m.name: m.exporter for m in models}
    derived = [
        ("hf-bert-ts-qdyn", "quantize-dynamic", "hf-bert-ts", quantize_dynamic("hf-bert-ts"), "quantize_dynamic"),
        ("hf-llama-dynamo-qdyn", "quantize-dynamic", "hf-llama-dynamo", quantize_dynamic("hf-llama-dynamo"),
         "quantize_dynamic"),
        ("tv-resnet18-ts-qdq", "quantize-qdq", "tv-resnet18-ts", quantize_qdq("tv-resnet18-ts", VISION_DIMS),
         "quantize_static QDQ"),
        ("tv-mobilenet-v3-small-dynamo-qdq", "quantize-qdq", "tv-mobilenet-v3-small-dynamo",
         quantize_qdq("tv-mobilenet-v3-small-dynamo", VISION_DIMS), "quantize_static QDQ"),
        ("tv-resnet18-dynamo-fp16", "fp16", "tv-resnet18-dynamo", fp16("tv-resnet18-dynamo"),
         "convert_float_to_float16"),
        ("hf-bert-ts-fp16", "fp16", "hf-bert-ts", fp16("hf-bert-ts"), "convert_float_to_float16"),
        ("hf-bert-ts-fused", "ort-fusion", "hf-bert-ts", ort_fusion("hf-bert-ts", "bert"), "optimize_model bert"),
        ("hf-gpt2-ts-fused", "ort-fusion", "hf-gpt2-ts", ort_fusion("hf-gpt2-ts", "gpt2"), "optimize_model gpt2"),
        ("hf-bert-dynamo-fused", "ort-fusion", "hf-bert-dynamo", ort_fusion("hf-bert-dynamo", "bert"),
         "optimize_model bert"),
    ]
    for name, kind, source, build, tool in derived:
        dims = next(m.dims for m in models if m.name == source)
        models.append(ZooModel(name, kind, exporter[source], dict(dims), build, source=source, tool=tool))
    return models


def exporter_name(dynamo: bool) -> str:
    """Give the name zoo.json records for torch's exporter."""
    return "dynamo" if dynamo else "torchscript"


# ---------------------------------------------------------------------------------------------------------------
# Checking a model: its dims and one onnxruntime run

def random_feeds(model: Any, dims: dict[str, int], seed: int = 0) -> dict[str, Any]:
    """Give random inputs of the model's graph inputs at `dims`: token ids below VOCAB, masks of ones."""
    import numpy as np
    from onnx import helper

    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if "mask" in value.name:
            feeds[value.name] = np.ones(shape, dtype=dtype)
        elif np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(0, VOCAB, size=shape).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def check(path: Path, dims: dict[str, int]) -> float:
    """Check that the model's symbolic input dims are `dims`' names and that onnxruntime runs it at `dims`;
    give the seconds of that run."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    names = {d.dim_param for v in model.graph.input if v.name not in initializers
             for d in v.type.tensor_type.shape.dim if d.HasField("dim_param")}
    if names != set(dims):
        raise SkipModel(f"input dims named {sorted(names)}, not {sorted(dims)}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = random_feeds(model, dims)
    started = time.perf_counter()
    session.run(None, feeds)
    return round(time.perf_counter() - started, 3)


# ---------------------------------------------------------------------------------------------------------------
# Building the zoo

def build_model(model: ZooModel, out: Path, by_name: dict[str, ZooModel], seconds: dict[str, float],
                failed: dict[str, str], announce: bool = True) -> bool:
    """Build `model` into `out` (its source first) unless its file is there; say whether the file is there.
    `announce`: say so when the file is there already."""
    path = out / model.file
    if path.exists():
        if announce:
            print(f"have  {model.name}")
        return True
    if model.name in failed:
        return False
    if model.source is not None and not build_model(by_name[model.source], out, by_name, seconds, failed,
                                                    announce=False):
        failed[model.name] = f"its source {model.source} was not built"
        print(f"skip  {model.name}: {failed[model.name]}")
        return False
    partial = out / f"{model.name}.partial.onnx"
    started = time.perf_counter()
    try:
        with quiet():
            model.build(partial, out)
            seconds[model.name] = check(partial, model.dims)
    except SkipModel as exc:
        failed[model.name] = str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure of a library skips the model, never the zoo
        failed[model.name] = reason(exc)
        if os.environ.get("ZOO_DEBUG"):
            traceback.print_exc()
    if model.name in failed:
        for leftover in out.glob(f"{model.name}.partial.onnx*"):
            leftover.unlink()
        print(f"skip  {model.name}: {failed[model.name]}")
        return False
    partial.rename(path)
    print(f"built {model.name} ({time.perf_counter() - started:.1f} s, {path.stat().st_size / 2**20:.1f} MiB, "
          f"onnxruntime run at {model.dims}: {seconds[model.name]:.3f} s)")
    return True


def reason(exc: BaseException) -> str:
    """Give the one-line reason of a failure: the exception's type, and its first cause where it has one (the
    exporters wrap the error that tells what went wrong)."""
    root = exc
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    if root is exc:
        return f"{type(exc).__name__}: {first_line(exc)}"
    return f"{type(exc).__name__} from {type(root).__name__}: {first_line(root)}"


def first_line(exc: BaseException) -> str:
    """Give the first non-empty line of an exception's message, without terminal colours, cut to 160 characters."""
    import re

    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if line.strip()]
    return (lines[0] if lines else repr(exc))[:160]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the exporters' and tools' progress messages, warnings and logging."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def write_index(out: Path, models: Sequence[ZooModel], seconds: dict[str, float],
                failed: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Write DIR/zoo.json: every model whose file is in `out`, in the zoo's order, and the reasons of the models
    that failed to build (this run's, and earlier runs' for models not built since); give its entries."""
    index = out / INDEX
    before: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    if index.exists():
        written = json.loads(index.read_text())
        before = {entry["name"]: entry for entry in written["models"]}
        skipped = dict(written.get("skipped", {}))
    skipped.update(failed or {})
    entries = []
    for model in models:
        if not (out / model.file).exists():
            continue
        entries.append({
            "name": model.name, "file": model.file, "kind": model.kind, "exporter": model.exporter,
            "source": model.source, "tool": model.tool or None, "dims": model.dims,
            "ort_seconds": seconds.get(model.name, before.get(model.name, {}).get("ort_seconds")),
        })
    built = {entry["name"] for entry in entries}
    skipped = {name: why for name, why in skipped.items() if name not in built and name in {m.name for m in models}}
    index.write_text(json.dumps({"schema": SCHEMA, "versions": versions(), "models": entries, "skipped": skipped},
                                indent=1) + "\n")
    return entries


def versions() -> dict[str, str]:
    """Give the versions of the libraries the zoo is built with (those installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "torchvision", "timm", "transformers", "onnx", "onnxscript", "onnxruntime",
                    "onnxconverter-common"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def main(argv: Sequence[str] | None = None, models: Sequence[ZooModel] | None = None,
         default_out: Path = DEFAULT_OUT, description: str | None = __doc__) -> None:
    """Build the zoo (or the models named with --only), skip what is built, and write zoo.json. `models`,
    `default_out`, `description`: another zoo built with this one's machinery (benchmarks/zoo2.py)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=default_out, help=f"the zoo folder (default {default_out})")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="build these models (and their sources) only")
    parser.add_argument("--list", action="store_true", help="list the models and whether they are built")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser().resolve()
    if out == REPO or REPO in out.parents:
        raise SystemExit(f"zoo: {out} is inside the repository; choose a folder outside it")
    models = list(models) if models is not None else zoo_models()
    by_name = {m.name: m for m in models}
    unknown = sorted(set(args.only or ()) - set(by_name))
    if unknown:
        raise SystemExit(f"zoo: unknown model(s) {', '.join(unknown)}; see --list")
    if args.list:
        for m in models:
            state = "built" if (out / m.file).exists() else "-"
            origin = f"from {m.source} by {m.tool}" if m.source else f"{m.exporter} export"
            print(f"{m.name:34} {m.kind:17} {origin:60} {json.dumps(m.dims):26} {state}")
        return
    out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)
    chosen = [by_name[name] for name in args.only] if args.only else models
    seconds: dict[str, float] = {}
    failed: dict[str, str] = {}
    started = time.perf_counter()
    for model in chosen:
        build_model(model, out, by_name, seconds, failed)
    entries = write_index(out, models, seconds, failed)
    print(f"\n{len(entries)} of {len(models)} models in {out / INDEX}; {len(failed)} skipped; "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

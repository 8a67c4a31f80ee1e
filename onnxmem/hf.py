"""Size a Hugging Face transformers model from its config.json alone: no weights, no hub (the `torch` extra and
transformers).

The model is built on PyTorch's meta device (every parameter has its shape and dtype, none has data) and exported
with the dynamo exporter as onnxmem.torch.export_for_training does (train mode and no KV cache for a training
estimate); each weight is written as external data in a sparse file that holds no byte on disk, so the file reads
as the model's export to every command. Stacks of identical layers are exported twice and repeated in the graph
(frontends/layers.py): a 70B config is sized in seconds.

    with onnxmem.hf.exported("Llama-3-70B/config.json", training=True) as path:
        report = onnxmem.analyze(path, {"batch": 1, "seq": 4096}, training=onnxmem.TrainingOptions())

or onnxmem.hf.analyze("config.json", {"batch": 1, "seq": 4096}); on the command line, --hf: the MODEL argument is a
config.json (or the folder that holds one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import io
import json
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxmem.errors import ModelFileError, OnnxMemError, one_line, require_extra
from onnxmem.frontends.child import in_child
from onnxmem.frontends.traced import Traced
from onnxmem.ir.load import read_small_text

CONFIG_FILE = "config.json"
CONFIG_LIMIT = 16 << 20  # a transformers config is a few KiB: more is no config
# The most layers a stack of a config may have: the model is built with every layer before two are traced (about
# 4 ms a layer on the meta device), and the largest published decoders have under 200
LAYERS_LIMIT = 4096
_LAYER_COUNT = re.compile(r"(^|_)(n_layers?|num_(hidden_)?layers|(encoder|decoder)_layers|num_layers)$")
# The task of an architecture, by the end of its class name (config.architectures[0]); the first that ends it.
ARCHITECTURE_TASKS = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForSpeechSeq2Seq", "speech-seq2seq"),
    ("ForConditionalGeneration", "seq2seq"),
    ("ForSequenceClassification", "classifier"),
    ("ForTokenClassification", "classifier"),
    ("ForMaskedLM", "masked-lm"),
    ("ForImageClassification", "vision"),
)
# Without architectures: the task of the first of transformers' Auto mappings that knows the config's model_type.
TASK_MAPPINGS = (
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("vision", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("classifier", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
)
TASKS = ("causal-lm", "decode", "seq2seq", "speech-seq2seq", "classifier", "masked-lm", "vision")
# decode: a causal LM's serving step with its KV cache (frontends/decode.py): prefill at past=0, decode at seq=1.
DECODE_TASK = "decode"
# The example sizes the export traces at (the dims stay symbolic: batch, seq, decoder_seq).
EXAMPLE_BATCH, EXAMPLE_SEQ = 2, 16
# What a failed export's message says, and the fix: (a text in the exporter's error, the fix).
EXPORT_FIXES = (
    ("DynamicCache", "the model returns its KV cache: set use_cache to false in the config"),
    ("grouped_mm", "its experts kernel does not export: model.set_experts_implementation('batched_mm')"),
    ("histc", "its experts kernel does not export: model.set_experts_implementation('batched_mm')"),
    ("data-dependent", "its forward branches on tensor values: export it at fixed shapes with "
                       "onnxmem.torch.export_for_training(model, inputs, path)"),
    ("DataDependent", "its forward branches on tensor values: export it at fixed shapes with "
                      "onnxmem.torch.export_for_training(model, inputs, path)"),
)
# The MoE experts kernel both exporters translate (transformers' default uses grouped_mm or histc).
EXPERTS_IMPLEMENTATION = "batched_mm"
# The rank of the adapters --lora adds to a config's model (PEFT's LoraConfig default).
LORA_RANK = 8


@dataclass(frozen=True)
class HfModel:
    """What the export of a config made: the file, the model class, the task, its dims and parameters."""

    path: Path
    model_class: str
    task: str
    dims: tuple[str, ...]  # the symbolic dims of its inputs (batch, seq, ...)
    parameters: int  # elements of the model's named_parameters (the whole model's: every layer)
    parameter_bytes: int  # their bytes at the dtype they were built in
    lora_parameters: int = 0  # of which LoRA adapters'


def config_path(config: str | os.PathLike[str]) -> Path:
    """Give the config.json a path names (the file, or the folder that holds one); raises ModelFileError."""
    path = Path(config)
    if path.is_dir():
        path = path / CONFIG_FILE
    if not path.is_file():
        raise ModelFileError(f"{config}: no transformers config here (a config.json, or a folder holding one)")
    return path


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the hub: a config is all that is read
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise require_extra("transformers", "hf", "--hf (a model from its config)") from None
    if "transformers" not in sys.modules:
        _without_a_broken_torchvision()
    try:
        import transformers
    except ImportError:
        raise require_extra("transformers", "hf", "--hf (a model from its config)") from None
    return transformers


def _without_a_broken_torchvision() -> None:
    """Where torchvision is installed but does not load with this torch (a wheel built for another version: its
    operators fail to register), import transformers without it: transformers imports it for its image utilities
    only, which no model built here needs (the detection models that import it in their modeling code then fail with
    its name). Left as it is where it loads or is absent."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 (a broken build raises RuntimeError, ImportError, OSError, ...)
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None  # type: ignore[assignment]  # (find_spec and import both see it absent)
        # (the exporter's registry then says, in a warning per operator, that it skips torchvision's)
        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)


def _config_data(path: Path) -> dict[str, Any]:
    """Give the JSON object a config.json holds; raises ModelFileError where it is no transformers config."""
    text = read_small_text(path, CONFIG_LIMIT)  # (a FIFO or a device is never read)
    if text is None:
        raise ModelFileError(f"{path}: not a config file (a regular UTF-8 file of at most {CONFIG_LIMIT >> 20} MiB)")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise ModelFileError(f"{path}: not a JSON config ({one_line(str(error) or type(error).__name__)})") from None
    if not isinstance(data, dict) or not data.get("model_type"):
        raise ModelFileError(f"{path}: no model_type: not a transformers config")
    for owner in (data, *(v for v in data.values() if isinstance(v, dict))):  # (a composite's sub-configs too)
        for key, value in owner.items():
            if isinstance(key, str) and _LAYER_COUNT.search(key) and isinstance(value, int) and \
                    not isinstance(value, bool) and value > LAYERS_LIMIT:
                raise ModelFileError(f"{path}: {key} {value:,}: more layers than onnxmem builds (at most "
                                     f"{LAYERS_LIMIT:,}; published models have under 200)")
    return data


def load_config(config: str | os.PathLike[str]) -> Any:
    """Give the transformers config a config.json holds (read locally; no hub)."""
    path = config_path(config)
    tf = _transformers()
    data = _config_data(path)
    try:
        return tf.AutoConfig.for_model(**data)
    except ImportError as error:  # transformers' lazy import of the config class failed: say why
        cause = error.__cause__ or error
        raise OnnxMemError(f"{path}: transformers {tf.__version__} could not import the config class of model_type "
                           f"'{data.get('model_type')}' ({type(cause).__name__}: {one_line(str(cause))})") from None
    except Exception as error:  # noqa: BLE001 (transformers' and huggingface_hub's validation errors alike)
        raise ModelFileError(f"{path}: transformers {tf.__version__} does not take this config "
                             f"({_config_error(error)})") from None


def _config_error(error: Exception) -> str:
    """Give what transformers said of a config it refused, in one line: the known model types it lists after an
    unknown one left out (a few thousand characters)."""
    text = " ".join(str(error).split())
    unknown = text.find(". Should contain one of")
    if unknown >= 0:
        text = f"{text[:unknown]}: not a model type of this transformers (its AutoConfig's CONFIG_MAPPING)"
    return one_line(text, 300)


def model_class(config: Any, task: str | None = None) -> tuple[str, str]:
    """Give the model class a config builds and its task: the config's first architecture, else the Auto mapping
    of the task (the first of TASK_MAPPINGS that knows the model type)."""
    import transformers.models.auto.modeling_auto as auto

    if task == DECODE_TASK:
        return model_class(config, "causal-lm")[0], DECODE_TASK
    architectures = [a for a in (getattr(config, "architectures", None) or []) if hasattr(_transformers(), a)]
    for name in architectures:
        found = next((t for end, t in ARCHITECTURE_TASKS if name.endswith(end)), None)
        if found == "seq2seq" and getattr(config, "num_mel_bins", None):
            found = "speech-seq2seq"
        if found is not None and (task is None or task == found):
            return name, found
    for mapped, table in TASK_MAPPINGS:
        names = getattr(auto, table, {})
        if (task is None or task == mapped or (task == "seq2seq" and mapped == "speech-seq2seq")) \
                and config.model_type in names:
            return names[config.model_type], mapped
    raise OnnxMemError(f"{config.model_type}: no model class for "
                       f"{'task ' + task if task else 'any task onnxmem sizes'} ({', '.join(TASKS)}) in transformers")


def _dtype(config: Any) -> Any:
    import torch

    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) and value.is_floating_point else torch.float32


def _inputs(config: Any, task: str) -> tuple[dict[str, Any], dict[str, dict[int, str]]]:
    """Give the example inputs of a task (on the meta device) and, per input, its symbolic axes' names."""
    import torch

    def ids(*shape: int) -> Any:
        return torch.zeros(shape, dtype=torch.long, device="meta")

    batch, seq = EXAMPLE_BATCH, EXAMPLE_SEQ
    text = {0: "batch", 1: "seq"}
    if task == "vision":
        size = getattr(config, "image_size", 224)
        size = size if isinstance(size, int) else size[0]
        channels = getattr(config, "num_channels", 3)
        pixels = torch.zeros((batch, channels, size, size), dtype=_dtype(config), device="meta")
        return {"pixel_values": pixels}, {"pixel_values": {0: "batch"}}
    if task == "speech-seq2seq":
        frames = 2 * getattr(config, "max_source_positions", 1500)
        features = torch.zeros((batch, config.num_mel_bins, frames), dtype=_dtype(config), device="meta")
        return ({"input_features": features, "decoder_input_ids": ids(batch, seq)},
                {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch", 1: "decoder_seq"}})
    if task == "seq2seq":
        return ({"input_ids": ids(batch, seq), "decoder_input_ids": ids(batch, seq)},
                {"input_ids": text, "decoder_input_ids": {0: "batch", 1: "decoder_seq"}})
    return {"input_ids": ids(batch, seq)}, {"input_ids": text}


def build(config: Any, task: str | None = None, *, lora: int | None = None, grouped_experts: bool = True) \
        -> tuple[Any, str, str]:
    """Give the model a config builds on the meta device (no weight data), its class name and task; with `lora`,
    wrapped by PEFT with LoRA adapters of that rank on PEFT's default target modules for the architecture; MoE
    experts as grouped_mm runs them (`grouped_experts`, see grouped_experts_forward) or as batched_mm does."""
    import torch

    tf = _transformers()
    name, found = model_class(config, task)
    config.use_cache = found == DECODE_TASK
    try:
        with torch.device("meta"):
            model = getattr(tf, name)._from_config(config, dtype=_dtype(config))
            if hasattr(model, "set_experts_implementation") and _has_experts(model):
                model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
                if grouped_experts:
                    _size_experts_as_grouped(model)
            if lora is not None:
                model = _with_lora(model, lora)
    except OnnxMemError:
        raise
    except Exception as error:  # transformers raises many types; the user needs its message
        raise OnnxMemError(f"{name}: cannot be built from this config without weights "
                           f"({_first_line(error)})") from error
    return model, name, found


def _has_experts(model: Any) -> bool:
    return any(type(m).__name__.endswith("Experts") for m in model.modules())


def _size_experts_as_grouped(model: Any) -> None:
    """Give every experts module of `model` grouped_experts_forward as its forward (this instance only)."""
    import types

    for module in model.modules():
        if type(module).__name__.endswith("Experts") and hasattr(module, "down_proj") and \
                (hasattr(module, "gate_up_proj") or hasattr(module, "up_proj")):
            module.forward = types.MethodType(grouped_experts_forward, module)


def grouped_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """Give an MoE experts block's output with the tensors transformers' grouped_mm kernel makes, for sizing only:
    the S = tokens x top-k (token, expert) pairs sorted by expert, gathered ([S, hidden]), through each expert's
    up (or gate-up) projection, its activation and its down projection ([S, 2 x intermediate], [S, intermediate],
    [S, hidden]), weighted, put back in order and summed per token. grouped_mm gives each expert the pairs routed
    to it, a count known only when it runs (its histc and grouped_mm export with neither exporter); here each expert
    takes an equal share of the S rows, which makes the same tensors. The values are not the model's (the export
    has no weights to compute them with); batched_mm, which exports, gathers each pair's expert weights instead
    ([S, 2 x intermediate, hidden]: a copy of the expert per token)."""
    import torch
    import torch.nn.functional as functional

    top_k = top_k_index.size(-1)
    tokens, hidden = hidden_states.size(0), hidden_states.size(-1)
    pairs = tokens * top_k
    _, order = torch.sort(top_k_index.reshape(-1))
    rows = hidden_states[order // top_k]
    weights = top_k_weights.reshape(-1)[order]
    has_gate = getattr(self, "has_gate", hasattr(self, "gate_up_proj"))
    up = self.gate_up_proj if has_gate else self.up_proj
    bias_up = getattr(self, "gate_up_proj_bias" if has_gate else "up_proj_bias", None) \
        if getattr(self, "has_bias", False) else None
    bias_down = getattr(self, "down_proj_bias", None) if getattr(self, "has_bias", False) else None
    transposed = getattr(self, "is_transposed", False)
    experts = up.size(0)

    def linear(x: Any, weight: Any, bias: Any) -> Any:
        y = x @ weight if transposed else functional.linear(x, weight)
        return y if bias is None else y + bias

    outputs = []
    for e in range(experts):
        share = rows[e * pairs // experts:(e + 1) * pairs // experts]
        projected = linear(share, up[e], None if bias_up is None else bias_up[e])
        projected = self._apply_gate(projected) if has_gate else self.act_fn(projected)
        outputs.append(linear(projected, self.down_proj[e], None if bias_down is None else bias_down[e]))
    out = torch.cat(outputs, 0)
    if getattr(self, "has_post_expert_norm", False):
        out = self.post_expert_norm(out)
    out = (out * weights.unsqueeze(-1))[torch.argsort(order)]
    return out.view(tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


def _with_lora(model: Any, rank: int) -> Any:
    try:
        import peft
    except ImportError:
        raise require_extra("peft", "lora", "--lora with --hf (LoRA adapters)") from None
    if rank < 1:
        raise OnnxMemError(f"LoRA rank {rank}: must be at least 1")
    # the model PEFT injects its adapters into (the PeftModel's forward takes **kwargs, which export cannot name):
    # its parameters are named as its own named_parameters names them ('...q_proj.lora_A.default.weight')
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0))
    return wrapped.get_base_model()


def _first_line(error: BaseException) -> str:
    """Give the first line of an error's innermost cause (the exporter wraps the reason in its own steps)."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def export_config(config: str | os.PathLike[str], path: str | os.PathLike[str], *, training: bool = False,
                  task: str | None = None, lora: int | None = None, repeat_layers: bool = True) -> HfModel:
    """Write the ONNX export of the model a config.json describes at `path` (weights as external data in a sparse
    file beside it, `path`.data, that holds no byte on disk) and give what was made.

    Parameters
    ----------
    config : path
        A transformers config.json, or the folder that holds one. Nothing is downloaded.
    path : path
        The ONNX file to write.
    training : bool
        Export as the model trains (train mode, no KV cache): the file a training estimate reads.
    task : str, optional
        causal-lm, decode, seq2seq, speech-seq2seq, classifier, masked-lm or vision; default: the config's
        architecture. decode: a causal LM's serving step with its KV cache (frontends/decode.py), not for training.
    lora : int, optional
        Add LoRA adapters of this rank (PEFT's LoraConfig on its default target modules; the `lora` extra).
    repeat_layers : bool
        Export two layers of each stack of identical layers and repeat them in the graph (the same file, in a
        fraction of the time); False: trace every layer.

    Raises
    ------
    ModelFileError
        No config there, or not one transformers reads.
    OnnxMemError
        The model cannot be built without weights, or exported (the message names the model class and the fix).
    """
    _check_task(task, training)
    traced = trace_config(config, training=training, task=task, lora=lora, repeat_layers=repeat_layers)
    target = Path(path)
    write_traced(traced, target)
    return HfModel(target, traced.model_class, traced.task, traced.dims, *traced.counts)


def trace_config(config: str | os.PathLike[str], *, training: bool = False, task: str | None = None,
                 lora: int | None = None, repeat_layers: bool = True) -> Traced:
    """Give the export of the model a config.json describes before its layers are repeated (export_config's
    arguments)."""
    _check_task(task, training)
    loaded = load_config(config)
    model, name, found = build(loaded, task, lora=lora)
    parameters = sum(p.numel() for p in model.parameters())
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    lora_parameters = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    counts = (parameters, parameter_bytes, lora_parameters)
    if found == DECODE_TASK:
        traced = _trace_decode(model, name, loaded, repeat=repeat_layers)
    else:
        inputs, per_input = _inputs(loaded, found)
        traced = _trace(model, name, found, inputs, per_input, training=training, repeat=repeat_layers)
        del inputs
    del model
    gc.collect()  # the exporter's graphs are cycles, and the command line runs with the collector off
    return dataclasses.replace(traced, counts=counts)


def _check_task(task: str | None, training: bool) -> None:
    if task is not None and task not in TASKS:
        raise OnnxMemError(f"unknown task '{task}': choose one of {', '.join(TASKS)}")
    if task == DECODE_TASK and training:
        raise OnnxMemError("task decode is a serving step (inference with a KV cache): no training estimate; "
                           "use task causal-lm to size training")


def _trace_decode(model: Any, name: str, config: Any, *, repeat: bool) -> Traced:
    """Give the decode export of a causal LM (frontends/decode.py), its layers not yet repeated."""
    from onnxmem.frontends import decode
    from onnxmem.frontends.layers import KEPT_LAYERS, cut_layer_stacks

    model.eval()
    layers = int(config.get_text_config(decoder=True).num_hidden_layers)
    stacks = cut_layer_stacks(model) if repeat else {}
    traced = min(layers, KEPT_LAYERS) if stacks else layers  # (the decoder's stack is cut to its first two)
    inputs, dynamic, input_names, output_names, axes = decode.decode_inputs(
        config, traced, _dtype(config), EXAMPLE_BATCH, EXAMPLE_SEQ)
    decode.with_decode_forward(model, config)
    proto = _exported_proto(model, name, inputs, dynamic, names=(input_names, output_names))
    axes = [*axes[:2], *(axes[2] for _ in range(2 * layers))]  # (every layer's cache, once repeated)
    return Traced(proto, name, DECODE_TASK, stacks, axes, {}, decode.per_layer_names(), (0, 0, 0))


def _trace(model: Any, name: str, task: str, inputs: dict[str, Any], axes: dict[str, dict[int, str]], *,
           training: bool, repeat: bool) -> Traced:
    import torch

    from onnxmem.frontends.layers import cut_layer_stacks
    from onnxmem.torch import training_properties

    model.train(training)
    # (read before the layers are cut: the repeated layers' copies take the names of every layer)
    properties = training_properties(model) if training else {}
    stacks = cut_layer_stacks(model) if repeat else {}
    dynamic = {key: {axis: torch.export.Dim.DYNAMIC for axis in per_input} for key, per_input in axes.items()}
    proto = _exported_proto(model, name, inputs, dynamic)
    return Traced(proto, name, task, stacks, list(axes.values()), properties, None, (0, 0, 0))


def write_traced(traced: Traced, target: Path) -> None:
    """Finish an export (its layers repeated, its dims named, what onnxmem does not read dropped, its weights stored
    outside) and write it at `target`."""
    _finish(traced.proto, traced.model_class, target, traced.stacks, traced.axes, properties=traced.properties,
            per_layer=traced.per_layer)


def _finish(proto: Any, name: str, target: Path, stacks: dict[str, int], axes: list[dict[int, str]], *,
            properties: Mapping[str, str], per_layer: Mapping[str, str] | None = None) -> None:
    """Repeat the layers of an export (`per_layer`: frontends/layers.py's), name its dims, drop what onnxmem does not
    read, store its weights outside and write it at `target`."""
    import onnx

    from onnxmem.frontends.layers import repeat_layers
    from onnxmem.torch import name_dims

    if stacks and not repeat_layers(proto, stacks, per_layer):
        raise OnnxMemError(f"{name}: its layers' exports differ although their modules are alike: size it with "
                           "repeat_layers=False (every layer traced)")
    name_dims(proto, axes)
    if not properties:  # an inference export
        _fold_weight_transposes(proto.graph)
    _store_weights_outside(proto, target)
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props}, **properties})
    onnx.save(proto, str(target))


def _exported_proto(model: Any, name: str, inputs: dict[str, Any], dynamic: dict[str, Any],
                    names: tuple[list[str], list[str]] | None = None) -> Any:
    """Give the ONNX ModelProto of the dynamo export of a meta-device model (`dynamic`: its inputs' dynamic shapes,
    `names`: its graph inputs' and outputs' names): every weight an external tensor of its dtype and shape (offsets
    set by _store_weights_outside)."""
    import onnx_ir as ir
    import torch

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, (), kwargs=inputs, dynamo=True, optimize=False,
                                        dynamic_shapes=dynamic, input_names=names[0] if names else None,
                                        output_names=names[1] if names else None)
    except Exception as error:  # the exporter raises many types; the user needs its message and the fix
        text = f"{_first_line(error)} {error}"
        fix = next((f for key, f in EXPORT_FIXES if key in text), "export it yourself with "
                   "onnxmem.torch.export_for_training(model, inputs, path) and run onnxmem on the file")
        raise OnnxMemError(f"{name}: torch.onnx.export failed ({_first_line(error)}); fix: {fix}") from error
    if program is None:
        raise OnnxMemError(f"{name}: torch.onnx.export gave no program")
    for value in program.model.graph.initializers.values():
        tensor = value.const_value
        raw = getattr(tensor, "raw", None)
        if tensor is None or not isinstance(raw, torch.Tensor) or raw.device.type != "meta":
            continue  # a constant the exporter made, with its data: kept in the file
        value.const_value = ir.ExternalTensor("", 0, raw.numel() * raw.element_size(), tensor.dtype,
                                              shape=ir.Shape(raw.shape), name=value.name or "")
    proto = ir.serde.serialize_model(program.model)
    _drop_unread_metadata(proto.graph)  # (before the layers are repeated: their copies never carry it)
    return proto


# Node metadata the exporter writes that onnxmem never reads (the module scope is read from `namespace`, the ATen
# op from pkg.torch.onnx.fx_node): dropped (Mixtral-8x7B's report in one process: peak RSS 1,040 -> 951 MiB).
UNREAD_METADATA = frozenset({"pkg.torch.onnx.stack_trace", "pkg.torch.onnx.class_hierarchy",
                             "pkg.torch.onnx.name_scopes"})


def _drop_unread_metadata(graph: Any) -> None:
    for node in graph.node:
        kept = [(p.key, p.value) for p in node.metadata_props if p.key not in UNREAD_METADATA]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            for key, value in kept:
                node.metadata_props.add(key=key, value=value)


def _fold_weight_transposes(graph: Any) -> None:
    """Store each weight that only a Transpose reads transposed, that node removed (its readers read the weight,
    under the weight's name): a Linear's weight as torch.onnx.export's optimizer writes it (optimize=True, the
    default), and as onnxruntime's constant folding holds it. Left in, onnxruntime with its optimizations off runs
    each Transpose, and its order runs them first: a 70B decoder's inference peak held 25 GB of transposed
    weights. Not for a training export, whose estimate reads the linear op the two nodes came from."""
    import onnx

    weights = {t.name: t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        source = node.input[0] if node.op_type == "Transpose" and len(node.input) == 1 else ""
        if source in weights and readers[source] == 1 and node.output[0] not in outputs:
            tensor = weights[source]
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None) or \
                list(range(len(tensor.dims)))[::-1]
            tensor.dims[:] = [tensor.dims[p] for p in perm]
            renamed[node.output[0]] = source
            continue
        kept.append(node)
    if not renamed:
        return
    for node in kept:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    folded = set(renamed) | set(renamed.values())  # (a weight's own value_info has its dims before the fold)
    infos = [v for v in graph.value_info if v.name not in folded]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _store_weights_outside(proto: Any, target: Path) -> None:
    """Point every external weight of `proto` at its place in `target`.data, one after another, and make that
    file: sparse, of their total size (nothing is written: onnxmem never reads weight data to size a model)."""
    import onnx

    location = f"{target.name}.data"
    offset = 0
    for tensor in proto.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        length = int(float(entries.get("length", "0")))
        del tensor.external_data[:]
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        offset += length
    with open(target.parent / location, "wb") as data:
        data.truncate(offset)


def _stderr_line(line: str) -> None:
    sys.stderr.write(f"onnxmem: {line}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def exported(config: str | os.PathLike[str], *, training: bool = False, task: str | None = None,
             lora: int | None = None, progress: Callable[[str], None] | None = _stderr_line,
             templates: bool | None = None) -> Iterator[HfModel]:
    """Give the export of a config (export_config): from the per-user cache where an earlier command made it
    (frontends/hfcache.py), else from a shipped graph template of its family where one applies
    (frontends/templates.py: no torch, in a second or two; `templates` False, or ONNXMEM_HF_TEMPLATES=off, never),
    else made in the cache; with the cache off (ONNXMEM_HF_CACHE=off) or unwritable, made in a temporary folder
    removed when the block ends. `progress` is told, in one line, where the export came from (default: a line on
    stderr; None: nothing)."""
    say = progress or (lambda line: None)
    path = config_path(config)
    made = cached_export(path, training=training, task=task, lora=lora, progress=say, missing=False)
    if made is None:
        from onnxmem.frontends import templates as graph_templates

        _check_task(task, training)
        use = graph_templates.enabled() if templates is None else templates
        data = _config_data(path) if use and lora is None else None
        found = graph_templates.find_template(data, training=training, task=task, lora=lora) \
            if data is not None else None
        if found is not None:
            start = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="onnxmem-hf-") as folder:
                made = _from_template(found, Path(folder), training, task, lambda line: say(f"{path}: {line}"))
                if made is not None:
                    say(f"{path}: from {found[0].label} in {time.perf_counter() - start:.1f} s")
                    yield made
                    return
        elif data is not None:
            reason = graph_templates.refusal(data, training=training, task=task)
            if reason is not None:
                say(f"{path}: {reason}; exporting")
        made = cached_export(path, training=training, task=task, lora=lora, progress=say)
    if made is not None:
        yield made
        return
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnxmem-hf-") as folder:
        made = in_child(export_config, path, Path(folder) / f"{path.parent.name or 'model'}.onnx",
                        training=training, task=task, lora=lora)
        say(f"{path}: exported in {time.perf_counter() - start:.1f} s (not cached)")
        yield made


def _from_template(found: Any, folder: Path, training: bool, task: str | None,
                   say: Callable[[str], None]) -> HfModel | None:
    """Give the export a template makes (frontends/templates.py) in `folder`; None, said, where its files do not
    read back (the config is then exported)."""
    from google.protobuf.message import DecodeError

    from onnxmem.frontends.templates import TooLarge

    try:
        traced = found[0].instantiate(found[1])
        target = folder / f"{traced.model_class}{_suffix(training, task)}.onnx"
        write_traced(traced, target)
    except TooLarge as error:
        say(f"{found[0].label} does not apply: {error}; exporting")
        return None
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError, DecodeError) as error:
        say(f"{found[0].path.name} is not a whole template ({type(error).__name__}: {one_line(str(error), 120)}); "
            "exporting instead")
        return None
    return HfModel(target, traced.model_class, traced.task, traced.dims, *traced.counts)


def cached_export(config: str | os.PathLike[str], *, training: bool = False, task: str | None = None,
                  lora: int | None = None, progress: Callable[[str], None] | None = None,
                  missing: bool = True) -> HfModel | None:
    """Give the export of a config kept in the per-user cache (frontends/hfcache.py), made and kept there on a
    miss (`missing` False: None on a miss); None where the cache is off or cannot be written. An entry that does not
    read back whole is made again. `progress` is told whether the export came from the cache."""
    from onnxmem.frontends import hfcache

    say = progress or (lambda line: None)
    _check_task(task, training)
    folder = hfcache.cache_folder()
    if folder is None:
        return None
    path = config_path(config)
    key = hfcache.export_key(_config_data(path), task=task, training=training, lora=lora)
    hit = hfcache.read_entry(folder, key)
    made = _hf_model(*hit) if hit is not None else None
    if made is not None:
        say(f"{path}: the export from the cache ({made.path.parent})")
        return made
    if not missing:
        return None
    if hit is not None:
        with contextlib.suppress(OSError):
            hfcache.remove_entry(folder, key)  # (it read back, but not as an export: made again)
    start = time.perf_counter()

    def make(staging: Path) -> tuple[Path, dict[str, Any]]:
        done = in_child(_export_named, path, staging, training, task, lora)
        fields = {f.name: getattr(done, f.name) for f in dataclasses.fields(done) if f.name != "path"}
        return done.path, {**fields, "dims": list(done.dims)}

    placed = hfcache.write_entry(folder, key, make)
    made = _hf_model(*placed) if placed is not None else None
    if made is not None:
        say(f"{path}: exported in {time.perf_counter() - start:.1f} s, kept in the cache ({made.path.parent})")
    return made


def _export_named(path: Path, folder: Path, training: bool, task: str | None, lora: int | None) -> HfModel:
    """Give export_config's export into `folder`, the file named by the model class (and the task)."""
    name, _ = model_class(load_config(path), task)
    return export_config(path, folder / f"{name}{_suffix(training, task)}.onnx", training=training, task=task,
                         lora=lora)


def _suffix(training: bool, task: str | None) -> str:
    return "-training" if training else "-decode" if task == DECODE_TASK else ""


def _hf_model(path: Path, made: Mapping[str, Any]) -> HfModel | None:
    """Give the HfModel an entry's record describes, None where it does not describe one."""
    names = [f.name for f in dataclasses.fields(HfModel) if f.name != "path"]
    if set(made) != set(names) or not isinstance(made["dims"], list):
        return None
    try:
        return HfModel(path=path, **{**made, "dims": tuple(made["dims"])})
    except TypeError:
        return None


def analyze(config: str | os.PathLike[str], dims: Mapping[str, int] | None = None, *, task: str | None = None,
            lora: int | None = None, templates: bool | None = None, **options: Any) -> Any:
    """Give the memory report of the model a config.json describes (onnxmem.analyze's, with its options); a
    training estimate (training=TrainingOptions(...)) reads the train-mode export. `templates`: exported()'s."""
    from onnxmem.passes.pipeline import analyze as analyze_file

    with exported(config, training=options.get("training") is not None, task=task, lora=lora,
                  progress=None, templates=templates) as made:
        return analyze_file(made.path, dims, **options)


def fit(config: str | os.PathLike[str], *, task: str | None = None, lora: int | None = None,
        templates: bool | None = None, **options: Any) -> Any:
    """Give onnxmem.fit's answer (the largest batch, or `search`, that fits) for the model a config.json
    describes."""
    from onnxmem.plan.fit import fit as fit_file

    with exported(config, training=options.get("training") is not None, task=task, lora=lora,
                  progress=None, templates=templates) as made:
        return fit_file(made.path, **options)


def check(config: str | os.PathLike[str], dims: Mapping[str, int] | None = None, *, task: str | None = None,
          lora: int | None = None, templates: bool | None = None, **options: Any) -> Any:
    """Give onnxmem.check's verdict (does it fit the budget at these dims) for the model a config.json describes."""
    from onnxmem.plan.fit import check as check_file

    with exported(config, training=options.get("training") is not None, task=task, lora=lora,
                  progress=None, templates=templates) as made:
        return check_file(made.path, dims, **options)

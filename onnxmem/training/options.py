"""How a model is trained (TrainingOptions) and the checks and derived dims every training step reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxmem.errors import TrainingOptionError
from onnxmem.training.rules import LOSSES, OPTIMIZER_ALIASES, OPTIMIZERS, OptimizerRule

if TYPE_CHECKING:
    import onnx

    from onnxmem.targets.torch.base import DeviceModel

PRECISIONS = ("fp32", "amp-fp16", "amp-bf16", "bf16")
OPTIMIZER_IMPLEMENTATIONS = ("auto", "foreach", "for-loop", "fused")
PHASES = ("data", "forward", "loss", "backward", "optimizer")
# --checkpoint's names: "auto" (the what-if in sqrt n segments), "layers" (each repeated block checkpointed), or
# "layers:PATTERN,..." (the blocks of the levels named)
CHECKPOINT_NAMES = ("auto", "layers")
LAYER_LEVELS = "layers:"
# The parameters LoRA trains (lora=True): PEFT names every adapter tensor '<module>.lora_<part>...' (lora_A,
# lora_B, lora_embedding_A/B, lora_magnitude_vector: DoRA's), under the module it adapts; the rest is frozen.
LORA_PATTERNS = ("*.lora_*",)



@dataclass(frozen=True)
class QuantizedBase:
    """How bitsandbytes stores a frozen base weight (QLoRA's 4-bit, LLM.int8's 8-bit): `bits` per weight, packed;
    one absmax scale per `blocksize` weights (None: one per row), fp32, or with `nested_blocksize`, the scales
    themselves quantized to uint8 in blocks of that many with an fp32 absmax each and one fp32 offset
    (bnb_4bit_use_double_quant; quantize_4bit(compress_statistics=True))."""

    bits: int
    blocksize: int | None
    nested_blocksize: int | None = None

    def nbytes(self, numel: int, rows: int) -> int:
        """Give the bytes of one weight of `numel` elements in `rows` rows: its packed data and its scales (the
        code tables, 16 or 256 fp32 values that every weight's state shares, aside)."""
        data = (numel * self.bits + 7) // 8
        if self.blocksize is None:
            return data + rows * 4  # LLM.int8: one fp32 scale per row (SCB)
        blocks = -(-numel // self.blocksize)
        if self.nested_blocksize is None:
            return data + blocks * 4
        return data + blocks + -(-blocks // self.nested_blocksize) * 4 + 4


# The precisions a frozen base's Linear weights may be stored at (QLoRA: nf4 with double quantization, its paper's
# and transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True) layout).
BASE_PRECISIONS = {
    "nf4": QuantizedBase(4, 64, 256),
    "fp4": QuantizedBase(4, 64, 256),
    "nf4-no-double-quant": QuantizedBase(4, 64),
    "int8": QuantizedBase(8, None),
}


@dataclass(frozen=True)
class TrainingOptions:
    """How the model is trained: optimizer, precision, what is trainable, accumulation, checkpointing."""

    optimizer: str = "adamw"  # a key of training/rules.py OPTIMIZERS (or an alias: momentum, 8bit-adam, ...)
    precision: str = "fp32"  # fp32 | amp-fp16 | amp-bf16 (autocast, fp32 master weights) | bf16 (pure)
    freeze: tuple[str, ...] = ()  # fnmatch patterns of parameter names or module paths to freeze
    train: tuple[str, ...] = ()  # when given, only parameters matching one of these train
    grad_accum: int = 1  # micro-steps per optimizer step (the graph is bound at the micro-batch)
    micro_batch: int | None = None  # instead of grad_accum: the micro-batch size (the batch dim is divided by it)
    # activation checkpointing: a what-if in K segments, or "auto" (sqrt n); or "layers": the step as trained with
    # each repeated block checkpointed (transformers' gradient_checkpointing_enable(), timm's set_grad_checkpointing()),
    # or "layers:PATTERN[,PATTERN]": the blocks of the numbered levels matching (fnmatch) ('layers:stages': timm models
    # that checkpoint whole stages; 'layers:*encoder.layers,*conv_layers')
    checkpoint: int | str | None = None
    loss: str = "cross_entropy"  # a key of training/rules.py LOSSES, applied to the model's first float output
    batch_dim: str | None = None  # the dim that grad_accum divides; default: axis 0 of the first input
    optimizer_impl: str = "auto"  # auto (PyTorch's default on the device) | foreach | for-loop | fused
    # LoRA: only the adapters train (LORA_PATTERNS added to `train`), the base model frozen
    lora: bool = False
    # QLoRA / LLM.int8: the frozen Linear weights stored as bitsandbytes stores them (a key of BASE_PRECISIONS: nf4,
    # fp4, nf4-no-double-quant, int8), dequantized per layer to the compute precision while it runs; "": as exported
    base_precision: str = ""
    # where PyTorch trains: a device's name (a key of onnxmem.targets.torch.DEVICES: "cuda", "cpu"), for that device
    # with its default options, or a device with its own (TorchCpu(threads=4, isa="avx2"))
    device: str | DeviceModel = "cuda"

    def __post_init__(self) -> None:
        if self.lora and not set(LORA_PATTERNS) <= set(self.train):
            object.__setattr__(self, "train", (*self.train, *LORA_PATTERNS))

    @property
    def device_model(self) -> DeviceModel:
        """Give the device PyTorch trains on: the one named, with its default options, or the one given."""
        if isinstance(self.device, str):
            from onnxmem.targets.torch import device_named

            return device_named(self.device)
        return self.device

    @property
    def checkpoints_layers(self) -> bool:
        """Say whether the step is trained with each repeated block checkpointed (checkpoint="layers[:LEVELS]")."""
        return isinstance(self.checkpoint, str) and (self.checkpoint == "layers" or
                                                     self.checkpoint.startswith(LAYER_LEVELS))

    @property
    def checkpoint_levels(self) -> tuple[str, ...]:
        """Give the block levels checkpoint="layers:PATTERN,..." names (none: found)."""
        if not isinstance(self.checkpoint, str) or not self.checkpoint.startswith(LAYER_LEVELS):
            return ()
        return tuple(p.strip() for p in self.checkpoint.removeprefix(LAYER_LEVELS).split(",") if p.strip())

    @property
    def accumulates(self) -> bool:
        """Say whether gradients accumulate over micro-steps (they are then live through later forwards)."""
        return self.grad_accum > 1 or self.micro_batch is not None

    @property
    def update_impl(self) -> str:
        """Give the optimizer update's implementation: optimizer_impl, or PyTorch's default on the device (foreach on
        CUDA, a for-loop on CPU)."""
        if self.optimizer_impl != "auto":
            return self.optimizer_impl
        return self.device_model.default_update_impl

    def optimizer_rule(self) -> OptimizerRule:
        """Give the optimizer's rule; raises ValueError for an unknown name."""
        name = OPTIMIZER_ALIASES.get(self.optimizer, self.optimizer)
        if name not in OPTIMIZERS:
            raise TrainingOptionError(f"unknown optimizer '{self.optimizer}': choose one of {', '.join(OPTIMIZERS)}")
        return OPTIMIZERS[name]


def micro_batch_dims(model: onnx.ModelProto, dims: dict[str, int], options: TrainingOptions) -> dict[str, int]:
    """Give the dims a micro-step runs at: the batch dim divided by grad_accum (the same dims when it is 1)."""
    if not options.accumulates:
        return dict(dims)
    from onnxmem.shapes.dims import input_dims

    batch = options.batch_dim
    if batch is None:
        axis0 = [d.name for d in input_dims(model) if d.axis == 0]
        if not axis0:
            raise TrainingOptionError("gradient accumulation needs a batch dim: the inputs have no symbolic axis 0; "
                                      "name it with batch_dim")
        batch = axis0[0]
    if batch not in dims:
        raise TrainingOptionError(f"gradient accumulation: batch dim '{batch}' is not bound (bind it: "
                                  f"--dim {batch}=N, or dims={{'{batch}': N}} in Python)")
    if options.micro_batch is not None:
        if options.micro_batch < 1 or dims[batch] % options.micro_batch:
            raise TrainingOptionError(f"micro-batch {options.micro_batch} does not divide {batch}={dims[batch]}")
        return {**dims, batch: options.micro_batch}
    if dims[batch] % options.grad_accum:
        raise TrainingOptionError(f"gradient accumulation: {batch}={dims[batch]} is not a multiple of "
                                  f"{options.grad_accum} micro-steps")
    return {**dims, batch: dims[batch] // options.grad_accum}


def training_options(*, checkpoint: str | int | None = None, device: str = "cuda",
                     device_options: Mapping[str, object] | None = None, **values: object) -> TrainingOptions:
    """Give TrainingOptions from command-line values ('--checkpoint 4', 'auto' or 'layers'; the device by name, with
    its declared options as strings), checked."""
    segments: int | str | None = checkpoint
    if isinstance(checkpoint, str) and checkpoint not in CHECKPOINT_NAMES and not checkpoint.startswith(LAYER_LEVELS):
        try:
            segments = int(checkpoint)
        except ValueError:
            raise TrainingOptionError(f"--checkpoint '{checkpoint}': expected a number of segments, 'auto', "
                                      "'layers' or 'layers:PATTERN'") from None
    from onnxmem.targets.torch import device_named

    options = TrainingOptions(checkpoint=segments, device=device_named(device, device_options) if device_options
                              else device, **values)  # type: ignore[arg-type]
    check_options(options)
    return options


def resolve_optimizer(name: str) -> str:
    """Give the canonical optimizer name for a name or alias."""
    return OPTIMIZER_ALIASES.get(name, name)


def check_options(options: TrainingOptions) -> None:
    """Raise TrainingOptionError for an option no training step takes (a name not in its table, a count under 1)."""
    options.optimizer_rule()
    if options.precision not in PRECISIONS:
        raise TrainingOptionError(f"unknown precision '{options.precision}': choose one of {', '.join(PRECISIONS)}")
    if options.optimizer_impl not in OPTIMIZER_IMPLEMENTATIONS:
        raise TrainingOptionError(f"unknown optimizer implementation '{options.optimizer_impl}': choose one of "
                                  f"{', '.join(OPTIMIZER_IMPLEMENTATIONS)}")
    options.device_model.check()
    if options.loss not in LOSSES:
        raise TrainingOptionError(f"unknown loss '{options.loss}': choose one of {', '.join(LOSSES)}")
    if options.base_precision and options.base_precision not in BASE_PRECISIONS:
        raise TrainingOptionError(f"unknown base precision '{options.base_precision}': choose one of "
                                  f"{', '.join(BASE_PRECISIONS)}")
    if options.grad_accum < 1:
        raise TrainingOptionError("grad_accum must be at least 1")
    if isinstance(options.checkpoint, int) and options.checkpoint < 1:
        raise TrainingOptionError("checkpoint segments must be at least 1")
    if isinstance(options.checkpoint, str) and options.checkpoint not in CHECKPOINT_NAMES and \
            not options.checkpoint_levels:
        raise TrainingOptionError("checkpoint must be a number of segments, 'auto', 'layers' or 'layers:PATTERN' "
                                  "(a numbered module level: 'layers:stages', 'layers:*.layers')")



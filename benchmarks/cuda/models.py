"""The campaign's models: real architectures of varied families built from config classes with random weights
(torchvision, timm, transformers; nothing downloaded), at a GPU size and at a tiny dry-run size.

Each model returns one tensor (the logits) so that its ONNX export has one output, and trains with cross-entropy
against targets made before the step (classes per sample, or a class per token / frame).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 - PyTorch's own alias

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent.parent
VOCAB = 8000
DRY_VOCAB = 256


@dataclass
class Spec:
    """A model of the campaign: its family, how to build it, its inputs and targets at a batch, what trains in
    the frozen-backbone variant, and the batch it is measured at."""

    name: str
    family: str
    build: Callable[[bool], nn.Module]  # small (dry run) -> module
    inputs: Callable[[int, bool], tuple[torch.Tensor, ...]]  # batch, small -> model inputs (CPU)
    classes: Callable[[bool], int]  # small -> classes of the output's last axis
    heads: tuple[str, ...]  # fnmatch patterns of the parameters the frozen-backbone variant trains
    batch: int
    dry_batch: int = 2
    per_token: bool = False  # the output is [batch, positions, classes]: a target per position


def import_vision() -> None:
    """Import torchvision (and timm) usable: on a CPU build of torch that the PyPI torchvision wheel does not
    match, shared/tools/tvshim.py (ONNXMEM_TOOLS) first."""
    try:
        importlib.import_module("torchvision")
        return
    except Exception:  # noqa: BLE001 - the wheel's C++ ops fail to load in many ways
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
    tools = Path(os.environ.get("ONNXMEM_TOOLS", ROOT.parent / "shared" / "tools"))
    sys.path.insert(0, str(tools))
    importlib.import_module("tvshim")
    importlib.import_module("torchvision")


class LogitsOnly(nn.Module):
    """A transformers model that returns its logits only (no cache): the ONNX graph's one output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Give the logits for the token ids."""
        kwargs = {"use_cache": False} if getattr(self.model.config, "use_cache", None) is not None else {}
        return self.model(input_ids=ids, **kwargs).logits


class Seq2SeqLogits(LogitsOnly):
    """An encoder-decoder transformers model that returns its decoder's logits only."""

    def forward(self, ids: torch.Tensor, decoder_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Give the decoder's logits for the encoder's and the decoder's token ids."""
        return self.model(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits


# the transformer encoders with LayerDrop (not the convolutional feature encoder, whose train mode makes its input
# require grad)
LAYERDROP_ENCODERS = ("Wav2Vec2Encoder", "Wav2Vec2EncoderStableLayerNorm", "WhisperEncoder", "WhisperDecoder")


class AudioLogits(LogitsOnly):
    """A speech transformers model (raw audio in) that returns its per-frame logits only.

    Its encoders stay out of train mode while the rest trains (their dropouts are modules of their own and do train):
    transformers before 5.24 draws LayerDrop's `torch.rand([]) < layerdrop` in train mode even at layerdrop 0, a
    data-dependent branch that torch.export refuses (GuardOnDataDependentSymNode, the 2026-11-27 window's
    export/wav2vec2 rows) and FakeTensorMode cannot run; at layerdrop 0 no layer is ever skipped, so the step is
    the same."""

    def train(self, mode: bool = True) -> AudioLogits:
        """Set the mode of every module, then take the encoders (their LayerDrop branch) out of train mode."""
        super().train(mode)
        for module in self.modules():
            if type(module).__name__ in LAYERDROP_ENCODERS:
                module.training = False
        return self

    def forward(self, values: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Give the per-frame logits for the audio samples."""
        return self.model(input_values=values).logits


class TinyCNN(nn.Module):
    """A small CNN (conv, batch norm, ReLU, pool, linear): the dry run's model, torch alone."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Give the class logits."""
        return self.head(torch.flatten(self.features(x), 1))


class SpeechSeq2SeqLogits(AudioLogits):
    """A speech encoder-decoder transformers model (log-mel features in, Whisper) that returns its decoder's logits
    only; its encoder and decoder stay out of train mode for LayerDrop's branch, as AudioLogits' encoders (their
    layers, and the layers' dropouts, do train)."""

    def forward(self, features: torch.Tensor, decoder_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Give the decoder's logits for the encoder's log-mel features and the decoder's token ids."""
        return self.model(input_features=features, decoder_input_ids=decoder_ids, use_cache=False).logits


def _images(size: int, dry: int) -> Callable[[int, bool], tuple[torch.Tensor, ...]]:
    def make(batch: int, small: bool) -> tuple[torch.Tensor, ...]:
        side = dry if small else size
        return (torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(batch)),)
    return make


def _ids(seq: int, dry: int, decoder: bool = False) -> Callable[[int, bool], tuple[torch.Tensor, ...]]:
    def make(batch: int, small: bool) -> tuple[torch.Tensor, ...]:
        n = dry if small else seq
        vocab = DRY_VOCAB if small else VOCAB
        generator = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, vocab, (batch, n), generator=generator)
        return (ids, torch.randint(0, vocab, (batch, n), generator=generator)) if decoder else (ids,)
    return make


def _audio(samples: int, dry: int) -> Callable[[int, bool], tuple[torch.Tensor, ...]]:
    def make(batch: int, small: bool) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, dry if small else samples, generator=torch.Generator().manual_seed(batch)),)
    return make


def _features(mels: int, frames: int, seq: int, dry: tuple[int, int, int]) \
        -> Callable[[int, bool], tuple[torch.Tensor, ...]]:
    """Give a maker of log-mel features [batch, mels, frames] and decoder token ids [batch, seq] (the dry run's
    sizes: `dry`)."""
    def make(batch: int, small: bool) -> tuple[torch.Tensor, ...]:
        m, f, n = dry if small else (mels, frames, seq)
        generator = torch.Generator().manual_seed(batch)
        return (torch.randn(batch, m, f, generator=generator),
                torch.randint(0, _vocab(small), (batch, n), generator=generator))
    return make


def _tiny_cnn(small: bool) -> nn.Module:
    return TinyCNN(8 if small else 64)


def _torchvision(name: str) -> Callable[[bool], nn.Module]:
    def build(small: bool) -> nn.Module:
        import_vision()
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=10)
    return build


def _timm(name: str, dry: dict[str, Any] | None = None, **kwargs: Any) -> Callable[[bool], nn.Module]:
    """Give a builder of a timm model; the dry run's arguments replace kwargs' (`dry`; a ViT's by default)."""
    def build(small: bool) -> nn.Module:
        import_vision()
        import timm

        extra = dict(kwargs)
        if small and dry is not None:
            extra.update(dry)
        elif small and "img_size" in extra:
            extra.update(img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2)
        return timm.create_model(name, pretrained=False, num_classes=10, **extra)
    return build


def _hf(kind: str) -> Callable[[bool], nn.Module]:
    def build(small: bool) -> nn.Module:
        import_vision()  # transformers imports torchvision when it is installed
        import transformers as tf

        d, layers, heads, vocab = (32, 1, 2, DRY_VOCAB) if small else (256, 4, 8, VOCAB)
        common = {"vocab_size": vocab}
        if kind == "bert":
            return LogitsOnly(tf.BertForSequenceClassification(tf.BertConfig(
                num_hidden_layers=layers, hidden_size=d, intermediate_size=4 * d, num_attention_heads=heads,
                max_position_embeddings=512, num_labels=10, **common)))
        if kind == "gpt2":
            return LogitsOnly(tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=512,
                                                               bos_token_id=0, eos_token_id=0, **common)))
        if kind == "llama":  # grouped-query attention: 8 heads share 2 key/value heads
            return LogitsOnly(tf.LlamaForCausalLM(tf.LlamaConfig(
                num_hidden_layers=layers, hidden_size=d, intermediate_size=(8 * d) // 3, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 4), max_position_embeddings=512, **common)))
        if kind == "mixtral":  # mixture of experts: 4 experts, 2 per token
            return LogitsOnly(tf.MixtralForCausalLM(tf.MixtralConfig(
                num_hidden_layers=max(1, layers // 2), hidden_size=d, intermediate_size=2 * d,
                num_attention_heads=heads, num_key_value_heads=max(1, heads // 4), num_local_experts=4,
                num_experts_per_tok=2, max_position_embeddings=512, **common)))
        if kind == "t5":
            return Seq2SeqLogits(tf.T5ForConditionalGeneration(tf.T5Config(
                d_model=d, d_kv=d // heads, d_ff=4 * d, num_layers=max(1, layers // 2),
                num_decoder_layers=max(1, layers // 2), num_heads=heads, decoder_start_token_id=0, **common)))
        if kind == "wav2vec2":  # speech: a convolutional feature encoder on raw audio, then a transformer
            conv = (32, 32, 32) if small else (256, 256, 256, 256, 256)
            kernel, stride = ((10, 3, 2), (5, 2, 2)) if small else ((10, 3, 3, 3, 2), (5, 2, 2, 2, 2))
            return AudioLogits(tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
                hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * d,
                conv_dim=conv, conv_kernel=kernel, conv_stride=stride, num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=2, mask_time_prob=0.0, layerdrop=0.0, vocab_size=32)))
        if kind == "distilbert":
            return LogitsOnly(tf.DistilBertForSequenceClassification(tf.DistilBertConfig(
                n_layers=layers, dim=d, hidden_dim=4 * d, n_heads=heads, max_position_embeddings=512,
                num_labels=10, pad_token_id=0, **common)))
        if kind == "qwen2":  # grouped-query attention with biased q/k/v projections
            return LogitsOnly(tf.Qwen2ForCausalLM(tf.Qwen2Config(
                num_hidden_layers=layers, hidden_size=d, intermediate_size=(8 * d) // 3, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 4), max_position_embeddings=512, tie_word_embeddings=False,
                bos_token_id=0, eos_token_id=0, **common)))
        if kind == "phi3":  # fused q/k/v and gate/up projections (one Linear each: LoRA wraps them whole)
            return LogitsOnly(tf.Phi3ForCausalLM(tf.Phi3Config(
                num_hidden_layers=layers, hidden_size=d, intermediate_size=(8 * d) // 3, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2), max_position_embeddings=512,
                original_max_position_embeddings=512, bos_token_id=0, eos_token_id=0, pad_token_id=0, **common)))
        if kind == "whisper":  # speech encoder-decoder: two convolutions on log-mel features, then transformers
            mels, source = (16, 16) if small else (80, 750)  # the encoder takes 2 * max_source_positions frames
            return SpeechSeq2SeqLogits(tf.WhisperForConditionalGeneration(tf.WhisperConfig(
                d_model=d, encoder_layers=max(1, layers // 2), decoder_layers=max(1, layers // 2),
                encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=4 * d,
                decoder_ffn_dim=4 * d, num_mel_bins=mels, max_source_positions=source, max_target_positions=256,
                pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=0, begin_suppress_tokens=None,
                mask_time_prob=0.0, **common)))
        raise KeyError(kind)
    return build


def _vocab(small: bool) -> int:
    return DRY_VOCAB if small else VOCAB


SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("tiny_cnn", "cnn", _tiny_cnn, _images(64, 16), lambda small: 10, ("head.*",), 64, 4),
    Spec("resnet18", "cnn", _torchvision("resnet18"), _images(128, 32), lambda small: 10, ("fc.*",), 32),
    Spec("mobilenet_v3_small", "cnn-depthwise", _torchvision("mobilenet_v3_small"), _images(128, 32),
         lambda small: 10, ("classifier.*",), 32),
    Spec("convnext_atto", "cnn-timm", _timm("convnext_atto"), _images(128, 32), lambda small: 10, ("head.*",), 16),
    Spec("vit_small", "vit", _timm("vit_small_patch16_224", img_size=128), _images(128, 32), lambda small: 10,
         ("head.*",), 16),
    Spec("bert", "encoder", _hf("bert"), _ids(128, 16), lambda small: 10, ("model.classifier.*",), 16),
    Spec("gpt2", "decoder", _hf("gpt2"), _ids(256, 16), _vocab, ("model.transformer.h.3.*",
                                                                  "model.transformer.ln_f.*"), 8, per_token=True),
    Spec("llama_gqa", "decoder-gqa", _hf("llama"), _ids(256, 16), _vocab, ("model.lm_head.*",), 8, per_token=True),
    Spec("mixtral_moe", "decoder-moe", _hf("mixtral"), _ids(128, 16), _vocab, ("model.lm_head.*",), 8,
         per_token=True),
    # T5 ties its head to the shared embedding: the frozen variant trains the decoder's blocks
    Spec("t5", "encoder-decoder", _hf("t5"), _ids(128, 16, decoder=True), _vocab,
         ("model.decoder.block.*", "model.decoder.final_layer_norm.*"), 8, per_token=True),
    Spec("wav2vec2", "speech", _hf("wav2vec2"), _audio(16000, 400), lambda small: 32, ("model.lm_head.*",), 4,
         per_token=True),
)}
# held out: architectures that no rule was written from (benchmarks/cuda/score.py's RULES_WRITTEN_ON leaves them
# out), added for the window after 2026-11-27's (families none of the above has: squeeze-excitation, dense
# concatenation, shifted windows, fused projections, a speech encoder-decoder); most valuable first
NEW_SPECS: tuple[Spec, ...] = (
    Spec("qwen2", "decoder-gqa", _hf("qwen2"), _ids(256, 16), _vocab,
         ("model.model.layers.3.*", "model.model.norm.*"), 8, per_token=True),
    Spec("whisper", "speech-seq2seq", _hf("whisper"), _features(80, 1500, 128, (16, 32, 8)), _vocab,
         ("model.model.decoder.layers.1.*", "model.model.decoder.layer_norm.*"), 4, per_token=True),
    Spec("efficientnet_b0", "cnn-depthwise", _torchvision("efficientnet_b0"), _images(128, 32), lambda small: 10,
         ("classifier.*",), 32),
    Spec("swin_tiny", "vit-windowed", _timm("swin_tiny_patch4_window7_224", img_size=128, window_size=4,
                                            dry={"img_size": 32, "window_size": 2, "embed_dim": 16,
                                                 "depths": (1, 1), "num_heads": (1, 2)}),
         _images(128, 32), lambda small: 10, ("head.*",), 16),
    Spec("densenet121", "cnn-dense", _torchvision("densenet121"), _images(128, 32), lambda small: 10,
         ("classifier.*",), 32),
    Spec("phi3", "decoder-fused", _hf("phi3"), _ids(256, 16), _vocab, ("model.lm_head.*",), 8, per_token=True),
    Spec("distilbert", "encoder", _hf("distilbert"), _ids(128, 16), lambda small: 10,
         ("model.pre_classifier.*", "model.classifier.*"), 16),
)
SPECS.update((s.name, s) for s in NEW_SPECS)
# the models of the fit part: small, with large activations (the batch is found quickly, a step is short)
FIT_MODELS = ("resnet18", "gpt2", "llama_gqa", "vit_small")


class LoRALinear(nn.Module):
    """A Linear layer with a low-rank adapter: the base frozen, x @ A^T @ B^T (A: r x in, B: out x r) trained."""

    def __init__(self, base: nn.Linear, rank: int = 8) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.lora_b.weight)
        for parameter in self.base.parameters():
            parameter.requires_grad_(False)

    # what transformers reads of the layer it wrapped (T5's feed-forward casts to `wo.weight.dtype`: the 2026-11-27
    # window's training/t5/lora and export/t5/lora failed on "'LoRALinear' object has no attribute 'weight'")
    @property
    def weight(self) -> torch.Tensor:
        """Give the wrapped layer's weight."""
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        """Give the wrapped layer's bias."""
        return self.base.bias

    @property
    def in_features(self) -> int:
        """Give the wrapped layer's input features."""
        return self.base.in_features

    @property
    def out_features(self) -> int:
        """Give the wrapped layer's output features."""
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Give the base layer's output plus the adapter's."""
        return self.base(x) + self.lora_b(self.lora_a(x))


LORA_PATTERNS = ("*lora_a*", "*lora_b*")


def add_lora(model: nn.Module, rank: int = 8) -> int:
    """Give the number of Linear layers wrapped with low-rank adapters (every nn.Linear, and transformers' GPT-2
    Conv1D is left alone); every other parameter is frozen."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module, rank))
    return len(targets)


def targets_for(spec: Spec, output_shape: torch.Size, batch: int, small: bool) -> torch.Tensor:
    """Give the targets of a batch: a class per sample, or per position for a [batch, positions, classes]
    output."""
    generator = torch.Generator().manual_seed(1000 + batch)
    classes = int(output_shape[-1])
    shape = tuple(output_shape[:-1]) if spec.per_token else (batch,)
    return torch.randint(0, classes, shape, generator=generator)


def loss_of(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Give the cross-entropy of the output (flattened to [N, classes]) against the targets, in fp32 as autocast
    runs it."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def build(spec: Spec, small: bool, variant: str = "full", seed: int = 0) -> nn.Module:
    """Give the model (seeded random weights) in train mode, with the variant applied: full, frozen (only the
    head patterns train) or lora (adapters on every Linear, the rest frozen)."""
    import fnmatch

    torch.manual_seed(seed)
    model = spec.build(small)
    if variant == "frozen":
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(any(fnmatch.fnmatchcase(name, p) for p in spec.heads))
    elif variant == "lora":
        add_lora(model)
    return model.train()


def _grouped_mm_onnx(mat_a: Any, mat_b: Any, offs: Any, bias: Any = None, out_dtype: Any = None) -> Any:
    """Give the ONNX of a grouped matrix product (transformers' MoE experts: rows of `mat_a` sorted by expert,
    `offs` the cumulative row ends, `mat_b` [experts, in, out]): per expert, the product of every row with its
    weights kept where the row is the expert's. The output's shape is static ([rows, out], as the grouped GEMM's),
    unlike a gather of each group's rows (data-dependent sizes that shape inference cannot follow)."""
    from onnxscript import opset18 as op

    experts = mat_b.shape[0]
    if not isinstance(experts, int):
        raise ValueError("grouped_mm: the number of experts must be static")
    rows = op.Range(op.Constant(value_int=0), op.Squeeze(op.Shape(mat_a, start=0, end=1), [0]),
                    op.Constant(value_int=1))
    ends = op.Cast(offs, to=7)  # int64
    start = op.Constant(value_int=0)
    out = None
    for expert in range(experts):
        end = op.Gather(ends, op.Constant(value_int=expert), axis=0)
        mine = op.Unsqueeze(op.And(op.GreaterOrEqual(rows, start), op.Less(rows, end)), [1])
        product = op.MatMul(mat_a, op.Gather(mat_b, op.Constant(value_int=expert), axis=0))
        if bias is not None:
            product = op.Add(product, op.Gather(bias, op.Constant(value_int=expert), axis=0))
        out = op.Where(mine, product, op.CastLike(op.Constant(value_float=0.0), product) if out is None else out)
        start = end
    return out


def onnx_translations() -> dict[Any, Callable[..., Any]]:
    """Give the ONNX translations the exporter lacks for the campaign's models: transformers' grouped matrix
    product of MoE experts (its `grouped_mm_fallback` custom op, which it calls under torch.export for non-bf16
    weights: the 2026-11-27 window's export/mixtral_moe rows failed on 'No ONNX function found'), and ATen's."""
    table: dict[Any, Callable[..., Any]] = {}
    fallback = getattr(getattr(torch.ops, "transformers", None), "grouped_mm_fallback", None)
    if fallback is not None:
        table[fallback.default] = _grouped_mm_onnx
    grouped = getattr(torch.ops.aten, "_grouped_mm", None)
    if grouped is not None:
        table[grouped.default] = _grouped_mm_onnx
    return table


@contextlib.contextmanager
def onnx_export_translations() -> Iterator[None]:
    """Make torch.onnx.export take onnx_translations() (as onnxmem.torch.export_for_training calls it) inside the
    block."""
    import torch.onnx

    original = torch.onnx.export

    def export(*args: Any, **kwargs: Any) -> Any:
        table = {**onnx_translations(), **(kwargs.pop("custom_translation_table", None) or {})}
        return original(*args, custom_translation_table=table, **kwargs)

    torch.onnx.export = export  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.onnx.export = original

"""Build the second, held-out zoo: real architectures that are not in benchmarks/zoo.py's, to measure onnxmem on
models its rules were not written on.

    python benchmarks/zoo2.py [--out DIR] [--only NAME ...] [--list]

The same machinery as benchmarks/zoo.py (small configs, random weights, torch.manual_seed(0), nothing downloaded;
64x64 images; text models at 2 layers, hidden 64, vocab 1000; both torch exporters for some, one for others; the
dims `batch`, and `seq` for text) on other architectures: torchvision DenseNet-121, SqueezeNet 1.1, ShuffleNetV2,
RegNetY-400MF, a small ResNeXt, MNASNet, a small Swin-T, LR-ASPP segmentation; timm EfficientNetV2, MobileViT,
PoolFormer, DeiT; transformers DistilBERT, RoBERTa, ALBERT, Whisper's encoder, BART, Qwen2, Mistral, GPT-NeoX, Phi
and CLIP's text model; and quantized, fp16 and onnxruntime-fused variants of some. Files go to DIR (default
~/.cache/onnxmem-zoo2), with DIR/zoo.json as zoo.py writes it (its "skipped" lists each model that failed to build,
with the reason). `benchmarks/accuracy_ort.py --set real2` and `benchmarks/arena.py --set real2` measure it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.zoo import (  # noqa: E402
    EXPORTERS,
    IMAGE,
    MAX_POSITIONS,
    TEXT_DIMS,
    VISION_DIMS,
    VOCAB,
    Builder,
    Exportable,
    ZooModel,
    export,
    exporter_name,
    fp16,
    hf_model,
    import_torchvision,
    main,
    ort_fusion,
    quantize_dynamic,
    quantize_qdq,
    text,
    timm_model,
    vision,
)

DEFAULT_OUT = Path.home() / ".cache" / "onnxmem-zoo2"
MEL_BINS = 16  # Whisper's input features (batch, MEL_BINS, 2 * WHISPER_POSITIONS)
WHISPER_POSITIONS = 32


# ---------------------------------------------------------------------------------------------------------------
# torchvision

def tv(name: str, **kwargs: Any) -> Callable[[], Any]:
    """Give a builder of torchvision's model `name` with random weights and the given arguments."""

    def build() -> Any:
        return getattr(import_torchvision().models, name)(**kwargs)

    return build


def tv_resnext_small() -> Any:
    """A small ResNeXt: torchvision's ResNet with Bottleneck blocks, one per stage, 32 groups of width 4."""
    models = import_torchvision().models
    return models.ResNet(models.resnet.Bottleneck, [1, 1, 1, 1], groups=32, width_per_group=4, num_classes=10)


def tv_swin_small() -> Any:
    """torchvision's SwinTransformer (Swin-T's blocks) at a small size: embed 32, depths 1-1-2-1, window 4."""
    models = import_torchvision().models
    return models.SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8],
                                  window_size=[4, 4], num_classes=10)


def tv_lraspp() -> Any:
    """torchvision LR-ASPP on MobileNetV3-Large (segmentation, 4 classes), its "out" map only."""
    import torch

    models = import_torchvision().models

    class Out(torch.nn.Module):
        """The segmentation model's "out" output (not its dict)."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                                       num_classes=4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)["out"]

    return Out()


# ---------------------------------------------------------------------------------------------------------------
# transformers

def hf(class_name: str, config_name: str, **config: Any) -> Callable[[], Any]:
    """Give a builder of transformers' `class_name` on `config_name(**config)` (the shim loaded first)."""

    def build() -> Any:
        import transformers

        return getattr(transformers, class_name)(getattr(transformers, config_name)(**config))

    return hf_model(build)


SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 128, "max_position_embeddings": MAX_POSITIONS}
CAUSAL = {**SMALL, "use_cache": False, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}


def whisper_encoder() -> Exportable:
    """Whisper's encoder: 2 layers, d_model 64, 4 heads, on input features (batch, 16, 64)."""
    import torch
    import transformers

    class Encoder(torch.nn.Module):
        """The encoder's last hidden state."""

        def __init__(self) -> None:
            super().__init__()
            config = transformers.WhisperConfig(
                vocab_size=VOCAB, num_mel_bins=MEL_BINS, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                decoder_layers=2, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                max_source_positions=WHISPER_POSITIONS, max_target_positions=MAX_POSITIONS, pad_token_id=0,
                bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
            self.inner = transformers.WhisperModel(config).get_encoder()

        def forward(self, input_features: torch.Tensor) -> torch.Tensor:
            return self.inner(input_features=input_features)[0]

    features = torch.randn(2, MEL_BINS, 2 * WHISPER_POSITIONS)
    return Exportable(Encoder(), (features,), ("input_features",), ({0: "batch"},), ("output",), ({0: "batch"},))


def loaded(make: Callable[[], Exportable]) -> Callable[[], Exportable]:
    """Give `make` with the shim loaded first."""

    def build() -> Exportable:
        hf_model(lambda: None)()
        return make()

    return build


# ---------------------------------------------------------------------------------------------------------------
# The zoo: (name, kind, exportable, exporters)

BOTH = ("dynamo", "ts")
VISION: list[tuple[str, str, Callable[[], Any], tuple[str, ...]]] = [
    ("tv-densenet121", "torchvision", tv("densenet121", num_classes=10), BOTH),
    ("tv-squeezenet", "torchvision", tv("squeezenet1_1", num_classes=10), ("ts",)),
    ("tv-shufflenet-v2", "torchvision", tv("shufflenet_v2_x0_5", num_classes=10), BOTH),
    ("tv-regnet-y-400mf", "torchvision", tv("regnet_y_400mf", num_classes=10), ("dynamo",)),
    ("tv-resnext-small", "torchvision", tv_resnext_small, ("ts",)),
    ("tv-mnasnet", "torchvision", tv("mnasnet0_5", num_classes=10), ("dynamo",)),
    ("tv-swin-small", "torchvision", tv_swin_small, BOTH),
    ("tv-lraspp", "torchvision", tv_lraspp, ("ts",)),
    ("timm-efficientnetv2", "timm", timm_model("efficientnetv2_rw_t", num_classes=10), ("dynamo",)),
    ("timm-mobilevit", "timm", timm_model("mobilevit_xxs", num_classes=10), ("ts",)),
    ("timm-poolformer", "timm", timm_model("poolformer_s12", num_classes=10), ("dynamo",)),
    ("timm-deit", "timm", timm_model("deit_tiny_patch16_224", img_size=IMAGE, depth=2, num_classes=10), ("ts",)),
]
TEXT: list[tuple[str, Callable[[], Any], tuple[str, ...]]] = [
    ("hf-distilbert", hf("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4,
                         hidden_dim=128, max_position_embeddings=MAX_POSITIONS), BOTH),
    ("hf-roberta", hf("RobertaModel", "RobertaConfig", **{**SMALL, "max_position_embeddings": MAX_POSITIONS + 2}),
     ("dynamo",)),
    ("hf-albert", hf("AlbertModel", "AlbertConfig", embedding_size=32, **SMALL), ("ts",)),
    ("hf-bart", hf("BartModel", "BartConfig", vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                   max_position_embeddings=MAX_POSITIONS, use_cache=False, pad_token_id=1, bos_token_id=0,
                   eos_token_id=2, decoder_start_token_id=2), ("ts",)),
    ("hf-qwen2", hf("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2, **CAUSAL), BOTH),
    ("hf-mistral", hf("MistralForCausalLM", "MistralConfig", num_key_value_heads=2, **CAUSAL), ("ts",)),
    ("hf-gpt-neox", hf("GPTNeoXForCausalLM", "GPTNeoXConfig", **CAUSAL), ("dynamo",)),
    ("hf-phi", hf("PhiForCausalLM", "PhiConfig", **CAUSAL), ("ts",)),
    ("hf-clip-text", hf("CLIPTextModel", "CLIPTextConfig", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128, max_position_embeddings=MAX_POSITIONS),
     ("dynamo",)),
]
OTHER: list[tuple[str, str, Callable[[], Exportable], dict[str, int], tuple[str, ...]]] = [
    ("hf-whisper-encoder", "transformers", loaded(whisper_encoder), dict(VISION_DIMS), BOTH),
]


Derived = tuple[str, str, str, Builder, str]  # (name, kind, source model, builder, tool)


def models_of(vision_models: Sequence[tuple[str, str, Callable[[], Any], tuple[str, ...]]],
              text_models: Sequence[tuple[str, Callable[[], Any], tuple[str, ...]]],
              other_models: Sequence[tuple[str, str, Callable[[], Exportable], dict[str, int], tuple[str, ...]]],
              derived: Sequence[Derived]) -> list[ZooModel]:
    """Give a zoo's models: each source once per exporter it lists, then the models derived from them (each with its
    source's exporter and dims). The same for the second zoo and the third (benchmarks/zoo3.py)."""
    models: list[ZooModel] = []
    for name, kind, module, exporters in vision_models:
        for suffix in exporters:
            models.append(ZooModel(f"{name}-{suffix}", kind, exporter_name(EXPORTERS[suffix]), dict(VISION_DIMS),
                                   export(vision(module), EXPORTERS[suffix])))
    for name, model, exporters in text_models:
        for suffix in exporters:
            models.append(ZooModel(f"{name}-{suffix}", "transformers", exporter_name(EXPORTERS[suffix]),
                                   dict(TEXT_DIMS), export(text(model), EXPORTERS[suffix])))
    for name, kind, make, dims, exporters in other_models:
        for suffix in exporters:
            models.append(ZooModel(f"{name}-{suffix}", kind, exporter_name(EXPORTERS[suffix]), dict(dims),
                                   export(make, EXPORTERS[suffix])))
    exporter = {m.name: m.exporter for m in models}
    for name, kind, source, build, tool in derived:
        dims = next(m.dims for m in models if m.name == source)
        models.append(ZooModel(name, kind, exporter[source], dict(dims), build, source=source, tool=tool))
    return models


def zoo2_models() -> list[ZooModel]:
    """Give every model of the second zoo, sources before the models derived from them."""
    derived: list[Derived] = [
        ("hf-distilbert-ts-qdyn", "quantize-dynamic", "hf-distilbert-ts", quantize_dynamic("hf-distilbert-ts"),
         "quantize_dynamic"),
        ("hf-qwen2-dynamo-qdyn", "quantize-dynamic", "hf-qwen2-dynamo", quantize_dynamic("hf-qwen2-dynamo"),
         "quantize_dynamic"),
        ("tv-shufflenet-v2-ts-qdq", "quantize-qdq", "tv-shufflenet-v2-ts",
         quantize_qdq("tv-shufflenet-v2-ts", VISION_DIMS), "quantize_static QDQ"),
        ("tv-densenet121-dynamo-qdq", "quantize-qdq", "tv-densenet121-dynamo",
         quantize_qdq("tv-densenet121-dynamo", VISION_DIMS), "quantize_static QDQ"),
        ("tv-mnasnet-dynamo-fp16", "fp16", "tv-mnasnet-dynamo", fp16("tv-mnasnet-dynamo"),
         "convert_float_to_float16"),
        ("hf-distilbert-dynamo-fp16", "fp16", "hf-distilbert-dynamo", fp16("hf-distilbert-dynamo"),
         "convert_float_to_float16"),
        ("hf-distilbert-ts-fused", "ort-fusion", "hf-distilbert-ts", ort_fusion("hf-distilbert-ts", "bert"),
         "optimize_model bert"),
        ("hf-bart-ts-fused", "ort-fusion", "hf-bart-ts", ort_fusion("hf-bart-ts", "bart"), "optimize_model bart"),
    ]
    return models_of(VISION, TEXT, OTHER, derived)


if __name__ == "__main__":
    main(models=zoo2_models(), default_out=DEFAULT_OUT, description=__doc__)

"""Build the third, held-out zoo: real architectures in neither benchmarks/zoo.py's nor zoo2.py's, built after the
rules of both were written, to check that those rules carry to models nobody looked at.

    python benchmarks/zoo3.py [--out DIR] [--only NAME ...] [--list]

The same machinery as benchmarks/zoo.py (small configs, random weights, torch.manual_seed(0), nothing downloaded;
64x64 images; text models at 2 layers, hidden 64, vocab 1000; the dims `batch`, and `seq` for text) on other
architectures: torchvision GoogLeNet, MobileNetV2, DeepLabV3 on MobileNetV3; timm GhostNet, RepVGG, LCNet,
MLP-Mixer, EdgeNeXt, HRNet; transformers OPT, BLOOM (ALiBi), Gemma, ELECTRA, MPNet, DeBERTa-v2, SegFormer; and
quantized (int8 dynamic, QDQ, 4-bit MatMulNBits), fp16 and onnxruntime-fused variants of some. Files go to DIR
(default ~/.cache/onnxmem-zoo3), with DIR/zoo.json as zoo.py writes it (its "skipped" lists each model that failed
to build, with the reason).
`benchmarks/accuracy_ort.py --set real3` and `benchmarks/arena.py --set real3` measure it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.zoo import (  # noqa: E402
    IMAGE,
    MAX_POSITIONS,
    VISION_DIMS,
    VOCAB,
    Builder,
    Exportable,
    ZooModel,
    fp16,
    import_torchvision,
    main,
    ort_fusion,
    quantize_dynamic,
    quantize_qdq,
    timm_model,
)
from benchmarks.zoo2 import CAUSAL, SMALL, Derived, hf, loaded, models_of, tv  # noqa: E402

DEFAULT_OUT = Path.home() / ".cache" / "onnxmem-zoo3"


def tv_deeplab() -> Any:
    """torchvision DeepLabV3 on MobileNetV3-Large (segmentation, 4 classes: dilated convolutions, ASPP's global
    pooling branch, a bilinear upsample), its "out" map only."""
    import torch

    models = import_torchvision().models

    class Out(torch.nn.Module):
        """The segmentation model's "out" output (not its dict)."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                                          num_classes=4, aux_loss=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)["out"]

    return Out()


def segformer() -> Exportable:
    """transformers' SegFormer (MiT encoder, 2 stages of 1 block, hidden 16/32, and its all-MLP decode head) on
    (batch, 3, 64, 64) images: overlapping patch merges, efficient attention with spatial reduction, logits at 1/4."""
    import torch
    import transformers

    class Logits(torch.nn.Module):
        """The segmentation logits only."""

        def __init__(self) -> None:
            super().__init__()
            config = transformers.SegformerConfig(
                num_encoder_blocks=2, depths=[1, 1], sr_ratios=[4, 2], hidden_sizes=[16, 32], patch_sizes=[7, 3],
                strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=4)
            self.inner = transformers.SegformerForSemanticSegmentation(config)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.inner(pixel_values=pixel_values).logits

    return Exportable(Logits(), (torch.randn(2, 3, IMAGE, IMAGE),), ("pixel_values",), ({0: "batch"},),
                      ("logits",), ({0: "batch"},))


def quantize_4bit(source: str) -> Builder:
    """Give a builder of the 4-bit weight-only quantization of zoo model `source`'s MatMul weights (onnxruntime's
    MatMulNBitsQuantizer: com.microsoft MatMulNBits, blocks of 32, symmetric)."""

    def build(path: Path, out: Path) -> None:
        import logging

        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
        quantizer = MatMulNBitsQuantizer(onnx.load(str(out / f"{source}.onnx")), block_size=32, is_symmetric=True)
        quantizer.process()
        onnx.save(quantizer.model.model, str(path))

    return build


# ---------------------------------------------------------------------------------------------------------------
# The zoo: (name, kind, exportable, exporters)

BOTH = ("dynamo", "ts")
VISION: list[tuple[str, str, Callable[[], Any], tuple[str, ...]]] = [
    ("tv-googlenet", "torchvision", tv("googlenet", num_classes=10, aux_logits=False, init_weights=True), ("ts",)),
    ("tv-mobilenet-v2", "torchvision", tv("mobilenet_v2", num_classes=10), BOTH),
    ("tv-deeplabv3", "torchvision", tv_deeplab, ("dynamo",)),
    ("timm-ghostnet", "timm", timm_model("ghostnet_050", num_classes=10), ("dynamo",)),
    ("timm-repvgg", "timm", timm_model("repvgg_a0", num_classes=10), ("ts",)),
    ("timm-lcnet", "timm", timm_model("lcnet_050", num_classes=10), ("ts",)),
    ("timm-mixer", "timm", timm_model("mixer_s16_224", img_size=IMAGE, num_classes=10), ("dynamo",)),
    ("timm-edgenext", "timm", timm_model("edgenext_xx_small", num_classes=10), ("ts",)),
    ("timm-hrnet", "timm", timm_model("hrnet_w18_small", num_classes=10), ("dynamo",)),
]
TEXT: list[tuple[str, Callable[[], Any], tuple[str, ...]]] = [
    ("hf-opt", hf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64, max_position_embeddings=MAX_POSITIONS,
                  use_cache=False, pad_token_id=1, bos_token_id=2, eos_token_id=2), BOTH),
    ("hf-bloom", hf("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                    use_cache=False), ("ts",)),
    ("hf-gemma", hf("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=1, head_dim=16, **CAUSAL), ("dynamo",)),
    ("hf-electra", hf("ElectraModel", "ElectraConfig", embedding_size=32, **SMALL), BOTH),
    ("hf-mpnet", hf("MPNetModel", "MPNetConfig", **{**SMALL, "max_position_embeddings": MAX_POSITIONS + 2}),
     ("dynamo",)),
    ("hf-deberta-v2", hf("DebertaV2Model", "DebertaV2Config", **SMALL), ("ts",)),
]
OTHER: list[tuple[str, str, Callable[[], Exportable], dict[str, int], tuple[str, ...]]] = [
    ("hf-segformer", "transformers", loaded(segformer), dict(VISION_DIMS), BOTH),
]


def zoo3_models() -> list[ZooModel]:
    """Give every model of the third zoo, sources before the models derived from them."""
    derived: list[Derived] = [
        ("hf-opt-ts-qdyn", "quantize-dynamic", "hf-opt-ts", quantize_dynamic("hf-opt-ts"), "quantize_dynamic"),
        ("hf-electra-dynamo-qdyn", "quantize-dynamic", "hf-electra-dynamo", quantize_dynamic("hf-electra-dynamo"),
         "quantize_dynamic"),
        ("hf-gemma-dynamo-q4", "quantize-4bit", "hf-gemma-dynamo", quantize_4bit("hf-gemma-dynamo"),
         "MatMulNBitsQuantizer 4-bit"),
        ("hf-opt-ts-q4", "quantize-4bit", "hf-opt-ts", quantize_4bit("hf-opt-ts"), "MatMulNBitsQuantizer 4-bit"),
        ("tv-mobilenet-v2-ts-qdq", "quantize-qdq", "tv-mobilenet-v2-ts",
         quantize_qdq("tv-mobilenet-v2-ts", VISION_DIMS), "quantize_static QDQ"),
        ("tv-googlenet-ts-qdq", "quantize-qdq", "tv-googlenet-ts", quantize_qdq("tv-googlenet-ts", VISION_DIMS),
         "quantize_static QDQ"),
        ("tv-mobilenet-v2-dynamo-fp16", "fp16", "tv-mobilenet-v2-dynamo", fp16("tv-mobilenet-v2-dynamo"),
         "convert_float_to_float16"),
        ("hf-electra-ts-fp16", "fp16", "hf-electra-ts", fp16("hf-electra-ts"), "convert_float_to_float16"),
        ("hf-opt-dynamo-fp16", "fp16", "hf-opt-dynamo", fp16("hf-opt-dynamo"), "convert_float_to_float16"),
        ("hf-electra-ts-fused", "ort-fusion", "hf-electra-ts", ort_fusion("hf-electra-ts", "bert"),
         "optimize_model bert"),
        ("hf-mpnet-dynamo-fused", "ort-fusion", "hf-mpnet-dynamo", ort_fusion("hf-mpnet-dynamo", "bert"),
         "optimize_model bert"),
    ]
    return models_of(VISION, TEXT, OTHER, derived)


if __name__ == "__main__":
    main(models=zoo3_models(), default_out=DEFAULT_OUT, description=__doc__)

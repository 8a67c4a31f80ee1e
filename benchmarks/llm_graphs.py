"""Llama-shaped decoder graphs built with onnx.helper, their weights as external data that is never written.

    python benchmarks/llm_graphs.py OUT_DIR [--shape 7b|70b|deep|tiny]

The weight file named by every initializer does not exist: a tool that reads weight data cannot run on
these models, one that sizes tensors from their headers can. Symbolic dims: batch, seq, past.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx.helper as oh
from onnx import TensorProto


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int


SHAPES = {
    "7b": LlamaShape(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000),
    "70b": LlamaShape(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000),
    # about 100k nodes: a deep stack of small layers, where per-node costs dominate start-up
    "deep": LlamaShape(layers=1850, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=256),
    "tiny": LlamaShape(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256),
}


class _Builder:
    def __init__(self, dtype: int, data_file: str) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.dtype = dtype
        self.data_file = data_file
        self.offset = 0
        self.count = 0

    def weight(self, name: str, dims: list[int]) -> str:
        tensor = onnx.TensorProto(name=name, data_type=self.dtype, dims=dims)
        tensor.data_location = TensorProto.EXTERNAL
        size = 2 if self.dtype in (TensorProto.FLOAT16, TensorProto.BFLOAT16) else 4
        for d in dims:
            size *= d
        for key, value in (("location", self.data_file), ("offset", str(self.offset)), ("length", str(size))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += size
        self.inits.append(tensor)
        return name

    def const(self, name: str, values: list[int]) -> str:
        self.inits.append(oh.make_tensor(name, TensorProto.INT64, [len(values)], values))
        return name

    def op(self, op_type: str, inputs: list[str], scope: str, n_out: int = 1, **attrs: object) -> list[str]:
        self.count += 1
        name = f"{scope}/{op_type}_{self.count}"
        outputs = [f"{name}_out{i}" for i in range(n_out)]
        self.nodes.append(oh.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs

    def one(self, op_type: str, inputs: list[str], scope: str, **attrs: object) -> str:
        return self.op(op_type, inputs, scope, **attrs)[0]


def make_llama(shape: LlamaShape, dtype: int = TensorProto.FLOAT16, data_file: str = "weights.bin") -> onnx.ModelProto:
    """Give a Llama-style decoder with a KV cache; its weights are external and absent."""
    b = _Builder(dtype, data_file)
    head_dim = shape.hidden // shape.heads
    kv_dim = shape.kv_heads * head_dim
    group = shape.heads // shape.kv_heads
    split_heads = b.const("shape_heads", [0, 0, shape.heads, head_dim])
    split_kv = b.const("shape_kv", [0, 0, shape.kv_heads, head_dim])
    merge = b.const("shape_merge", [0, 0, shape.hidden])
    axes_last = b.const("axes_last", [-1])
    axes_2 = b.const("axes_2", [2])
    half = head_dim // 2
    starts0, ends_half = b.const("starts0", [0]), b.const("ends_half", [half])
    starts_half, ends_end = b.const("starts_half", [half]), b.const("ends_end", [head_dim])
    expand_kv = b.const("expand_kv", [1, 1, group, 1, 1])
    eps = b.weight("eps", [1])
    scale = b.weight("scale", [1])
    inputs = [
        oh.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        oh.make_tensor_value_info("attention_bias", dtype, ["batch", 1, "seq", "past + seq"]),
        oh.make_tensor_value_info("cos", dtype, ["seq", head_dim]),
        oh.make_tensor_value_info("sin", dtype, ["seq", head_dim]),
    ]
    outputs = []
    x = b.one("Gather", [b.weight("embed_tokens", [shape.vocab, shape.hidden]), "input_ids"], "/embed")

    def rms_norm(h: str, scope: str) -> str:
        sq = b.one("Mul", [h, h], scope)
        mean = b.one("ReduceMean", [sq, axes_last], scope)
        root = b.one("Sqrt", [b.one("Add", [mean, eps], scope)], scope)
        return b.one("Mul", [b.one("Div", [h, root], scope), b.weight(f"{scope}.weight", [shape.hidden])], scope)

    def rope(t: str, scope: str) -> str:
        lo = b.one("Slice", [t, starts0, ends_half, axes_last], scope)
        hi = b.one("Slice", [t, starts_half, ends_end, axes_last], scope)
        rotated = b.one("Concat", [b.one("Neg", [hi], scope), lo], scope, axis=-1)
        return b.one("Add", [b.one("Mul", [t, "cos"], scope), b.one("Mul", [rotated, "sin"], scope)], scope)

    for i in range(shape.layers):
        s = f"/layers.{i}"
        past_k, past_v = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        inputs += [oh.make_tensor_value_info(n, dtype, ["batch", shape.kv_heads, "past", head_dim])
                   for n in (past_k, past_v)]
        h = rms_norm(x, f"{s}/input_layernorm")
        a = f"{s}/self_attn"
        q = b.one("MatMul", [h, b.weight(f"{a}.q_proj", [shape.hidden, shape.hidden])], a)
        k = b.one("MatMul", [h, b.weight(f"{a}.k_proj", [shape.hidden, kv_dim])], a)
        v = b.one("MatMul", [h, b.weight(f"{a}.v_proj", [shape.hidden, kv_dim])], a)
        q = b.one("Transpose", [b.one("Reshape", [q, split_heads], a)], a, perm=[0, 2, 1, 3])
        k = b.one("Transpose", [b.one("Reshape", [k, split_kv], a)], a, perm=[0, 2, 1, 3])
        v = b.one("Transpose", [b.one("Reshape", [v, split_kv], a)], a, perm=[0, 2, 1, 3])
        q, k = rope(q, f"{a}/rope_q"), rope(k, f"{a}/rope_k")
        present_k = b.one("Concat", [past_k, k], a, axis=2)
        present_v = b.one("Concat", [past_v, v], a, axis=2)
        outputs += [oh.make_tensor_value_info(n, dtype, None) for n in (present_k, present_v)]
        if group > 1:  # grouped-query attention: repeat each KV head for its group of query heads
            def repeat(t: str, scope: str) -> str:
                t5 = b.one("Unsqueeze", [t, axes_2], scope)
                full = b.one("Expand", [t5, expand_kv], scope)
                target = b.const(f"{scope}.rep_{b.count}", [0, shape.heads, -1, head_dim])
                return b.one("Reshape", [full, target], scope)

            kk, vv = repeat(present_k, a), repeat(present_v, a)
        else:
            kk, vv = present_k, present_v
        scores = b.one("MatMul", [q, b.one("Transpose", [kk], a, perm=[0, 1, 3, 2])], a)
        scores = b.one("Add", [b.one("Mul", [scores, scale], a), "attention_bias"], a)
        probs = b.one("Softmax", [scores], a, axis=-1)
        ctx = b.one("Reshape", [b.one("Transpose", [b.one("MatMul", [probs, vv], a)], a, perm=[0, 2, 1, 3]), merge], a)
        x = b.one("Add", [x, b.one("MatMul", [ctx, b.weight(f"{a}.o_proj", [shape.hidden, shape.hidden])], a)], s)
        h = rms_norm(x, f"{s}/post_attention_layernorm")
        m = f"{s}/mlp"
        gate = b.one("MatMul", [h, b.weight(f"{m}.gate_proj", [shape.hidden, shape.ffn])], m)
        up = b.one("MatMul", [h, b.weight(f"{m}.up_proj", [shape.hidden, shape.ffn])], m)
        act = b.one("Mul", [b.one("Mul", [gate, b.one("Sigmoid", [gate], m)], m), up], m)
        x = b.one("Add", [x, b.one("MatMul", [act, b.weight(f"{m}.down_proj", [shape.ffn, shape.hidden])], m)], s)
    x = rms_norm(x, "/norm")
    logits = b.one("MatMul", [x, b.weight("lm_head", [shape.hidden, shape.vocab])], "/lm_head")
    outputs.insert(0, oh.make_tensor_value_info(logits, dtype, None))
    graph = oh.make_graph(b.nodes, "llama", inputs, outputs, initializer=b.inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)


def make_wide_cnn(blocks: int = 8, width: int = 512, dtype: int = TensorProto.FLOAT,
                  data_file: str = "weights.bin") -> onnx.ModelProto:
    """Give a wide VGG-style CNN over [batch, 3, 224, 224] images, its weights external and absent."""
    b = _Builder(dtype, data_file)
    x = "image"
    channels = 3
    for i in range(blocks):
        s = f"/block.{i}"
        out = min(width, 64 * 2 ** (i // 2))
        x = b.one("Conv", [x, b.weight(f"{s}.conv.weight", [out, channels, 3, 3]),
                           b.weight(f"{s}.conv.bias", [out])], s, pads=[1, 1, 1, 1])
        x = b.one("Relu", [x], s)
        if i % 2 == 1:
            x = b.one("MaxPool", [x], s, kernel_shape=[2, 2], strides=[2, 2])
        channels = out
    x = b.one("GlobalAveragePool", [x], "/head")
    x = b.one("Flatten", [x], "/head")
    logits = b.one("Gemm", [x, b.weight("/head.fc.weight", [1000, channels]), b.weight("/head.fc.bias", [1000])],
                   "/head", transB=1)
    graph = oh.make_graph(b.nodes, "wide_cnn", [oh.make_tensor_value_info("image", dtype, ["batch", 3, 224, 224])],
                          [oh.make_tensor_value_info(logits, dtype, ["batch", 1000])], initializer=b.inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.shape or ["tiny", "7b", "70b", "deep"]:
        model = make_llama(SHAPES[name], data_file=f"llama_{name}.onnx.data")
        path = args.out / f"llama_{name}.onnx"
        onnx.save(model, str(path))
        print(f"{path}: {len(model.graph.node)} nodes, weight file absent")


if __name__ == "__main__":
    main()

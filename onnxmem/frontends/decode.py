"""A causal LM's decode step exported from its config: the model reads its KV cache as flat inputs and writes the
grown cache as flat outputs, named as optimum and onnxruntime-genai name them, so the file reads as their export
(shapes/kvcache.py finds the cache by these names):

    inputs   input_ids [batch, seq], attention_mask [batch, past + seq],
             past_key_values.{i}.key / .value [batch, kv_heads, past, head_dim]
    outputs  logits [batch, seq, vocab], present.{i}.key / .value [batch, kv_heads, past + seq, head_dim]

The model's own forward is replaced on the instance (its parameters keep the names named_parameters gives them) by
one that builds transformers' DynamicCache from the flat tensors, runs the model with it and returns the logits and
the cache's tensors after the step. The same graph is the prefill step at past=0 and a decode step at seq=1.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

# The task name of the export (onnxmem.hf's --hf-task), the inputs' and outputs' names, the symbolic dims.
DECODE_TASK = "decode"
PAST_NAME = "past_key_values.{}.{}"
PRESENT_NAME = "present.{}.{}"
KINDS = ("key", "value")
# The past length the export traces at: not the example seq (16) nor 0/1, which the exporter would specialize.
EXAMPLE_PAST = 8


def cache_shape(config: Any) -> tuple[int, int]:
    """Give the key/value heads and the head size of a decoder's KV cache, from its (text) config."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return kv_heads, int(head_dim)


def decode_inputs(config: Any, layers: int, dtype: Any, batch: int, seq: int) \
        -> tuple[dict[str, Any], dict[str, Any], list[str], list[str], list[dict[int, str]]]:
    """Give a decode export's example inputs (meta device, `layers` layers' cache), its dynamic shapes (batch, seq
    and past shared by every tensor), its input and output names and each input's symbolic axes (the mask's length
    is named 'past + seq', as optimum names it 'past_sequence_length + 1': the exporter gives it a symbol of its
    own, which the model's slicing of the mask never ties to past and seq)."""
    import torch

    kv_heads, head_dim = cache_shape(config)
    batch_dim, seq_dim = torch.export.Dim("batch"), torch.export.Dim("seq")
    past_dim = torch.export.Dim("past", min=0)
    ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    mask = torch.ones((batch, EXAMPLE_PAST + seq), dtype=torch.long, device="meta")
    past = [torch.zeros((batch, kv_heads, EXAMPLE_PAST, head_dim), dtype=dtype, device="meta")
            for _ in range(2 * layers)]
    dynamic = {"input_ids": {0: batch_dim, 1: seq_dim}, "attention_mask": {0: batch_dim, 1: torch.export.Dim.DYNAMIC},
               "past_key_values": [{0: batch_dim, 2: past_dim} for _ in past]}
    input_names = ["input_ids", "attention_mask", *(PAST_NAME.format(i, k) for i in range(layers) for k in KINDS)]
    output_names = ["logits", *(PRESENT_NAME.format(i, k) for i in range(layers) for k in KINDS)]
    axes = [{0: "batch", 1: "seq"}, {0: "batch", 1: "past + seq"}, *({0: "batch", 2: "past"} for _ in past)]
    return ({"input_ids": ids, "attention_mask": mask, "past_key_values": past}, dynamic, input_names,
            output_names, axes)


def with_decode_forward(model: Any, config: Any) -> Any:
    """Give `model` (a causal LM, its layers possibly cut) with decode_forward as its forward (this instance)."""
    model.config.use_cache = True
    model.forward = types.MethodType(decode_forward, model)
    model._onnxmem_decode_config = config
    return model


def decode_forward(self: Any, input_ids: Any, attention_mask: Any, past_key_values: list[Any]) -> tuple[Any, ...]:
    """Give the logits and the flat present keys and values of one step of a causal LM over a flat past cache
    ([key_0, value_0, key_1, ...]) and the attention mask of the past and the step's positions."""
    from transformers import DynamicCache

    pairs = [(past_key_values[i], past_key_values[i + 1]) for i in range(0, len(past_key_values), 2)]
    cache: Any = DynamicCache(config=self._onnxmem_decode_config)
    for layer, (key, value) in zip(cache.layers, pairs, strict=False):
        # each layer's cache is its input itself (DynamicCache(pairs) would concatenate it to an empty tensor
        # first, outside the layer: the copies frontends/layers.py makes would all read the second layer's)
        layer.lazy_initialization(key, value)
        layer.keys, layer.values = key, value
    forward = type(self).forward
    # (transformers 5 names the argument cache; earlier versions past_key_values). The step grows the cache in place.
    named = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    out = forward(self, input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **{named: cache})
    present: list[Any] = []
    for layer in cache.layers[:len(pairs)]:
        present += [layer.keys, layer.values]
    return (out.logits, *present)


def per_layer_names(second: int = 1) -> dict[str, str]:
    """Give the cache inputs and outputs of the layer `second` (the one frontends/layers.py repeats), each with the
    template of its name in another layer ('{}': the layer's index)."""
    names: dict[str, str] = {}
    for kind in KINDS:
        for pattern in (PAST_NAME, PRESENT_NAME):
            names[pattern.format(second, kind)] = pattern.format("{}", kind)
    return names

"""Which kernel F.scaled_dot_product_attention takes on CPU, and so what it keeps for backward.

PyTorch's CPU picks flash attention (ScaledDotProductFlashAttentionForCpu) or the math path
(aten/src/ATen/native/transformers/sdp_utils_cpp.cpp, select_sdp_backend_cpp). Measured on torch 2.13.0+cpu, one
call per combination of q/k heads, enable_gqa, mask (none, causal, bool, float), dropout and dtype (fp32, autocast to
bf16), by the backward node PyTorch records (benchmarks/training_single_ops.py --sdpa-choice):
- dropout > 0: the math path, whatever the rest (rules.py "scaled_dot_product_attention(dropout)");
- k and v with fewer heads than q and enable_gqa off (they broadcast: Falcon's multi-query attention): the math path,
  which expands k and v to the query's heads inside matmul (copies kept by bmm) and keeps the probabilities
  (rules.py "scaled_dot_product_attention(math-gqa)"; with dropout "(dropout-gqa)");
- everything else, masks and enable_gqa included: flash attention (rules.py "scaled_dot_product_attention").
The math path computes in fp32 from 16-bit inputs (tables.py CPU_KERNELS). enable_gqa is a keyword argument the
loaded graph does not keep (ir/graph.py keeps the fx node's tensor arguments), but the exporter writes it as a
repeat of k inside the op's nodes (Unsqueeze -> Expand -> Reshape): that repeat says enable_gqa.
"""

from __future__ import annotations

from onnxmem.targets.torch.base import NodeContext

FUSED = "aten::scaled_dot_product_attention"
WITH_DROPOUT = "aten::scaled_dot_product_attention(dropout)"  # what the export marks (training/export.py)
BROADCAST = "aten::scaled_dot_product_attention(math-gqa)"
BROADCAST_DROPOUT = "aten::scaled_dot_product_attention(dropout-gqa)"

# the ops the exporter writes enable_gqa's repeat of k and v with, read from k inside the attention's own nodes
GQA_REPEAT_OPS: frozenset[str] = frozenset({"Unsqueeze", "Expand"})


def rule_key(context: NodeContext) -> str:
    """Give the rule key of what CPU's kernel keeps for this scaled_dot_product_attention call (context.key is
    FUSED or WITH_DROPOUT)."""
    q_heads, kv_heads = _heads(context, 0), _heads(context, 1)
    grouped = q_heads is not None and kv_heads is not None and q_heads != kv_heads
    if not grouped:
        return context.key
    if context.key == WITH_DROPOUT:
        return BROADCAST_DROPOUT  # math: k and v repeated (enable_gqa) or expanded (broadcast) to q's heads
    return FUSED if _repeated_inside(context) else BROADCAST


def _heads(context: NodeContext, position: int) -> int | None:
    inputs = context.node.inputs
    if position >= len(inputs) or inputs[position] < 0:
        return None
    shape = context.values[inputs[position]].shape or ()
    heads = shape[-3] if len(shape) == 4 else None
    return heads if isinstance(heads, int) and heads > 0 else None


def _origin_mark(origin: str) -> str:
    """Give an origin's ATen target and fx node name ('torch.ops.aten.x.default %x'), shared by the op's nodes."""
    return " ".join(origin.split(" ", 2)[:2])


def _repeated_inside(context: NodeContext) -> bool:
    """Say whether k is repeated to the query's heads among the attention op's own exported nodes (enable_gqa)."""
    graph, node = context.graph, context.node
    if node.graph_op is None:
        return False
    mark = _origin_mark(graph.ops[node.graph_op].origin)
    index = graph.tensor_index.get(context.values[node.inputs[1]].name)
    if not mark or index is None:
        return False
    return any(graph.ops[c].op_type in GQA_REPEAT_OPS and _origin_mark(graph.ops[c].origin) == mark
               for c in graph.tensors[index].consumers)

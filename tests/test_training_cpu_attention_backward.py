"""The math attention's backward on CPU (targets/torch/cpu/device.py _attention_backward, tables.py
CpuKernel.attention_backward): with dropout, its peak over what was live before it is one fp32 [..., q_len, kv_len]
tensor and one fp32 query-sized one (two under autocast), of which the step counts q, k and v's gradients at the
event; the rest is a backward temporary (benchmarks/training_single_ops.py --sdpa-dropout-backward)."""

from __future__ import annotations

from typing import Any

from onnxmem.targets.torch.base import NodeContext
from onnxmem.targets.torch.cpu.device import TorchCpu
from onnxmem.targets.torch.cpu.tables import CPU_KERNELS
from onnxmem.training.values import StepNode, StepValue

KEY = "aten::scaled_dot_product_attention(dropout)"


def _temporaries(batch: int, heads: int, tokens: int, width: int, precision: str, key: str = KEY,
                 needs_grad: bool = True) -> int:
    element = 2 if precision.startswith("amp-") else 4
    shape = (batch, heads, tokens, width)
    numel = batch * heads * tokens * width
    values = [StepValue(name, shape, numel, numel * element, True, "activation") for name in ("q", "k", "v", "y")]
    node = StepNode(key, "", "sdpa", "", (0, 1, 2), (3,), 0)
    graph: Any = None  # (read only by convolutions and recurrent ops)
    context = NodeContext(graph, 0, node, values, [needs_grad] * 4, precision, key)
    return TorchCpu(isa="avx2").node_facts(context).backward_temporaries


def test_the_dropout_attentions_backward_holds_the_probabilities_gradient() -> None:
    # the zoo's Data2Vec-Audio layer: 4 x 4 heads x 199 frames x 16; P = 2,534,464 B, Q = 203,776 B (fp32)
    probabilities, query = 4 * 4 * 4 * 199 * 199, 4 * 4 * 4 * 199 * 16
    # fp32: the peak P + Q, of which the step makes the three gradients (3 Q) at the event
    assert _temporaries(4, 4, 199, 16, "fp32") == probabilities + query - 3 * query
    # autocast: P + 2 Q in fp32, the three gradients counted at 16 bits
    assert _temporaries(4, 4, 199, 16, "amp-bf16") == probabilities + 2 * query - 3 * query // 2
    # where the probabilities are small the gradients are the peak: nothing besides
    assert _temporaries(4, 4, 32, 32, "fp32") == 0
    # a bf16 step (not measured), flash attention, and other keys: nothing
    assert _temporaries(4, 4, 199, 16, "bf16") == 0
    assert _temporaries(4, 4, 199, 16, "fp32", key="aten::scaled_dot_product_attention") == 0
    assert CPU_KERNELS[KEY].attention_backward == (1, 1)

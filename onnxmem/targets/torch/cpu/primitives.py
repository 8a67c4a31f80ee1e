"""oneDNN's cached primitives on PyTorch's CPU: which primitives each op of the step creates (a convolution's, an
exact GELU's eltwise, an LSTM's RNN primitives), keyed as oneDNN's primitive cache keys them
(tables.py OnednnPrimitives)."""

from __future__ import annotations

import math

from onnxmem.targets.torch.cpu.convolution import CpuRun, Primitive, convolution_shapes, cpu_convolution_primitives
from onnxmem.targets.torch.cpu.isa import detect_cpu_isa
from onnxmem.targets.torch.cpu.layout import channels_last_values
from onnxmem.targets.torch.cpu.tables import CPU_ISAS, CPU_KERNELS, CpuIsa
from onnxmem.training.rules import AUTOCAST_LOW_PRECISION
from onnxmem.training.values import StepNode, StepValue, known_shape, node_recurrent_dims, rule_key, saves_rule


def node_primitives(nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool], differentiable: list[bool],
                    cpu: CpuRun) -> dict[int, tuple[Primitive, ...]]:
    """Give, per node on CPU, the oneDNN primitives its forward and backward create (a Conv's:
    cpu_convolution_primitives; an exact GELU's: _gelu_primitives; an LSTM's: _lstm_primitives): cached by oneDNN,
    they are counted once per distinct key (_primitive_buffers)."""
    made = {}
    laid_out = channels_last_values(nodes, values)
    for n, node in enumerate(nodes):
        gelu = _gelu_primitives(node, nodes, values, needs_grad, differentiable[n], laid_out, cpu)
        if gelu:
            made[n] = gelu
            continue
        rule = saves_rule(node.op_type, node.domain)
        if rule is not None and rule.recurrent == "LSTM":
            lstm = _lstm_primitives(node, values, differentiable[n] and any(
                needs_grad[t] for t in node.inputs[:3] if t >= 0), cpu)
            if lstm:
                made[n] = lstm
            continue
        kernel = CPU_KERNELS.get(rule_key(node))
        if rule is None or kernel is None or not kernel.convolution:
            continue
        known = convolution_shapes(node, values, cpu)
        if known is None:
            continue
        (x, w, y), element = known
        inputs = node.inputs
        backward = differentiable[n]
        primitives = cpu_convolution_primitives(x, w, y, element, backward and needs_grad[inputs[0]],
                                                backward and needs_grad[inputs[1]], cpu.threads, cpu.isa)
        if primitives:
            made[n] = primitives
    return made


def _lstm_primitives(node: StepNode, values: list[StepValue], backward: bool, cpu: CpuRun) \
        -> tuple[Primitive, ...]:
    """Give the oneDNN primitives an LSTM node's training step creates on CPU (OnednnPrimitives.lstm_*): the
    process's first use, one per (input features, hidden, direction), one weight reorder where the input width is
    not the hidden size; all from its forward (measured as a whole: forward and backward). None where its backward
    does not run (an inference primitive: not measured) or its dims or an fp32 step are not known."""
    dims = node_recurrent_dims(node, values)
    x = values[node.inputs[0]] if node.inputs and node.inputs[0] >= 0 else None
    if not backward or dims is None or x is None or not x.numel or x.nbytes // x.numel != 4:
        return ()
    _, directions, _, features, hidden = dims
    if not features or not hidden:
        return ()
    return tuple((key, nbytes, False) for key, nbytes in lstm_primitives(features, hidden, directions, cpu.isa))


def lstm_primitives(features: int, hidden: int, directions: int, isa: CpuIsa | None = None) \
        -> list[tuple[tuple[object, ...], int]]:
    """Give the oneDNN primitives (cache key, bytes) an LSTM layer of `features` inputs, `hidden` units and
    `directions` directions creates in a training step (OnednnPrimitives.lstm_*): the process's first use, one per
    (input features, hidden, direction), one weight reorder where the input width is not the hidden size. Layers
    share the primitives of equal keys (oneDNN's cache)."""
    sizes = (CPU_ISAS[detect_cpu_isa()] if isa is None else isa).primitives
    made: list[tuple[tuple[object, ...], int]] = [(("lstm first use",), sizes.lstm_first_use)]
    made += [(("lstm", features, hidden, direction), sizes.lstm_direction) for direction in range(directions)]
    if features != hidden:
        made.append((("lstm weights reorder", features, hidden), sizes.lstm_weights_reorder))
    return made


GELU_OPS = frozenset({"Gelu", "aten::gelu"})  # the ONNX op, the ATen op fused back (from its marks or erf chain)


def _gelu_primitives(node: StepNode, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                     backward: bool, channels_last: set[int], cpu: CpuRun) -> tuple[Primitive, ...]:
    """Give the oneDNN eltwise primitives an exact GELU creates on CPU (OnednnPrimitives.eltwise_gelu_*): one for
    its forward and one for its backward, keyed by its shape, and the process's first GELU's extra; none where ATen
    does not call oneDNN (a channels-last or one-element input, bf16, fp16). The graph keeps no attributes: a Gelu
    is taken as the exact (erf) one, nn.GELU's default (a tanh one creates none: at most 32.8 KB over per shape)."""
    if node.op_type not in GELU_OPS or node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] < 0:
        return ()
    x = values[node.inputs[0]]
    shape = known_shape(x)
    # under autocast a GELU runs in the dtype its input comes in: 16 bits from a matmul or convolution (through a
    # bias Add, which autocast's linear makes 16-bit too)
    low = False
    if cpu.precision.startswith("amp-") and x.producer is not None:
        producer = nodes[x.producer]
        sources = [producer] + ([nodes[values[t].producer] for t in producer.inputs  # type: ignore[index]
                                 if t >= 0 and values[t].producer is not None]
                                if producer.op_type in ("Add", "Sub", "Mul", "Div") else [])
        low = any(p.op_type in AUTOCAST_LOW_PRECISION for p in sources)
    if shape is None or math.prod(shape) <= 1 or low or not x.numel or x.nbytes // x.numel != 4 \
            or node.inputs[0] in channels_last:
        return ()
    sizes = cpu.isa.primitives
    # the first-use key is the same for every GELU: counted once, at the first GELU's forward
    made: list[Primitive] = [(("eltwise gelu first use",), sizes.eltwise_gelu_first_use,
                                                         False),
                                                        (("eltwise gelu forward", shape), sizes.eltwise_gelu_forward,
                                                         False)]
    if backward and needs_grad[node.inputs[0]]:
        made.append((("eltwise gelu backward", shape), sizes.eltwise_gelu_backward, True))
    return tuple(made)

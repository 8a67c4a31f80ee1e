"""--checkpoint layers: each repeated block checkpointed as torch.utils.checkpoint(use_reentrant=False) does it (the
forward keeps each block's inputs only, the backward recomputes one block at a time), the blocks found from the
module scopes or, where the file names none, from a repeated run of ops; a model without blocks is refused."""

from __future__ import annotations

import onnx
import onnx.helper as oh
import pytest
from click.testing import CliRunner
from onnx import TensorProto

import onnxmem
from onnxmem.cli.commands import main
from onnxmem.errors import TrainingOptionError
from onnxmem.targets.torch import TorchCpu
from onnxmem.training.step import TrainingOptions

from . import graphs

R, D, H = 512, 256, 1024  # a block: MatMul [R, D] x [D, H], Relu, MatMul [R, H] x [H, D], Relu


def blocks(count: int = 3, scoped: bool = True) -> onnx.ModelProto:
    """`count` blocks 'layers.N' (two MatMul + Relu pairs each), then a head 'head' ([R, D] x [D, 16])."""
    nodes, inits, previous = [], [], "x"
    for i in range(count):
        scope = f"/layers.{i}/" if scoped else f"n{i}_"
        inits += [graphs.external_header(f"A{i}", TensorProto.FLOAT, [D, H]),
                  graphs.external_header(f"B{i}", TensorProto.FLOAT, [H, D])]
        nodes += [oh.make_node("MatMul", [previous, f"A{i}"], [f"h{i}"], name=f"{scope}up"),
                  oh.make_node("Relu", [f"h{i}"], [f"a{i}"], name=f"{scope}act1"),
                  oh.make_node("MatMul", [f"a{i}", f"B{i}"], [f"g{i}"], name=f"{scope}down"),
                  oh.make_node("Relu", [f"g{i}"], [f"r{i}"], name=f"{scope}act2")]
        previous = f"r{i}"
    inits.append(graphs.external_header("Wh", TensorProto.FLOAT, [D, 16]))
    nodes.append(oh.make_node("MatMul", [previous, "Wh"], ["y"], name="/head/MatMul" if scoped else "head"))
    return graphs.model(nodes, [graphs.value("x", [R, D])], [graphs.value("y", [R, 16])], inits)


def train(model: onnx.ModelProto, **options: object) -> onnxmem.Report:
    return onnxmem.analyze(model, training=TrainingOptions(optimizer="sgd", **options))  # type: ignore[arg-type]


def test_layers_keep_only_each_blocks_input() -> None:
    plain, layers = train(blocks()), train(blocks(), checkpoint="layers")
    assert plain.training is not None and layers.training is not None
    # Without checkpointing each block keeps its inner Relu's output a_i [R, H] (read by the second MatMul, saved by
    # Relu and MatMul) and its output r_i [R, D]; with it, a block keeps only its input (x, then r_0, r_1), and the
    # head keeps r_2: the three inner [4, H] tensors are no longer kept at the loss.
    assert plain.training.saved_activation_bytes - layers.training.saved_activation_bytes == 3 * R * H * 4
    assert layers.training.peak_bytes < plain.training.peak_bytes
    assert layers.training.checkpoint is None  # the step as trained, not a what-if
    (warning,) = [w for w in layers.warnings if w.code == "checkpoint-layers"]
    assert "3 blocks layers.N (layers.0 to layers.2), from the module scopes" in warning.message
    assert not [w for w in plain.warnings if w.code == "checkpoint-layers"]


def test_backward_recomputes_one_block_at_a_time() -> None:
    layers = train(blocks(), checkpoint="layers").training
    assert layers is not None
    labels = list(layers.timeline.events)
    recomputes = [i for i, label in enumerate(labels) if label.startswith("recompute")]
    assert len(recomputes) == 3 * 4  # every node of the three blocks, once
    # the last block is recomputed (its 4 nodes) and its backward runs before the middle block is recomputed
    last_block_backward = labels.index("backward of MatMul /layers.2/up")
    middle_recompute = labels.index("recompute MatMul /layers.1/up")
    assert recomputes[:4] == list(range(recomputes[0], recomputes[0] + 4))
    assert last_block_backward < middle_recompute


def test_on_cpu_the_autograd_graph_is_built_in_forward() -> None:
    # use_reentrant=False: the forward builds every op's autograd node (the heap CPU counts), so at the end of the
    # forward the graph of all 13 ops is live; the K-segment what-if (reentrant) builds a segment's in its recompute
    cpu = TorchCpu(threads=1)
    assert cpu.autograd_node_bytes > 0
    plain, layers = (train(blocks(), device=cpu, checkpoint=c).training for c in (None, "layers"))
    assert plain is not None and layers is not None
    end = max(i for i, phase in enumerate(plain.timeline.phases) if phase in ("forward", "loss"))
    # (with the graph built in the recompute, 12 more nodes' bytes would be missing at the forward's end)
    assert plain.timeline.first_live_bytes[end] - layers.timeline.first_live_bytes[end] == 3 * R * H * 4


def test_without_module_names_repeated_ops_are_the_blocks() -> None:
    report = train(blocks(scoped=False), checkpoint="layers")
    (warning,) = [w for w in report.warnings if w.code == "checkpoint-layers"]
    assert "3 blocks of 4 ops" in warning.message and "repeated run of ops" in warning.message
    scoped = train(blocks(), checkpoint="layers")
    assert report.training is not None and scoped.training is not None
    assert report.training.peak_bytes == scoped.training.peak_bytes


def test_no_block_is_refused_with_one_line(tmp_path: object) -> None:
    single = blocks(1)
    with pytest.raises(TrainingOptionError, match="no repeated block"):
        train(single, checkpoint="layers")
    path = f"{tmp_path}/single.onnx"
    onnx.save(single, path)
    result = CliRunner().invoke(main, ["report", path, "--training", "--checkpoint", "layers"])
    assert result.exit_code != 0 and "no repeated block" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    bad = CliRunner().invoke(main, ["report", path, "--training", "--checkpoint", "blocks"])
    assert bad.exit_code == 2 and "'layers'" in bad.output


def test_k_segments_stay_a_what_if() -> None:
    plain, what_if = train(blocks()), train(blocks(), checkpoint=2)
    assert plain.training is not None and what_if.training is not None
    assert what_if.training.peak_bytes == plain.training.peak_bytes
    assert what_if.training.checkpoint is not None and what_if.training.checkpoint.segments == 2


def staged(stages: int = 2, per_stage: int = 2) -> onnx.ModelProto:
    """`stages` stages 'stages.S' of `per_stage` blocks 'stages.S.blocks.B' (a MatMul + Relu each)."""
    nodes, inits, previous = [], [], "x"
    for s in range(stages):
        for b in range(per_stage):
            scope, w = f"/stages.{s}/blocks.{b}/", f"W{s}_{b}"
            inits.append(graphs.external_header(w, TensorProto.FLOAT, [D, D]))
            nodes += [oh.make_node("MatMul", [previous, w], [f"h{s}_{b}"], name=f"{scope}fc"),
                      oh.make_node("Relu", [f"h{s}_{b}"], [f"r{s}_{b}"], name=f"{scope}act")]
            previous = f"r{s}_{b}"
    return graphs.model(nodes, [graphs.value("x", [R, D])], [graphs.value(previous, [R, D])], inits)


def test_blocks_inside_stages_and_a_named_level() -> None:
    # found: the blocks (4 of them), not the stages that hold them (2); named: the stages
    found = train(staged(), checkpoint="layers")
    (warning,) = [w for w in found.warnings if w.code == "checkpoint-layers"]
    assert "4 blocks stages.*.blocks.N (stages.0.blocks.0 to stages.1.blocks.1)" in warning.message
    stages = train(staged(), checkpoint="layers:stages")
    (warning,) = [w for w in stages.warnings if w.code == "checkpoint-layers"]
    assert "2 blocks stages.N" in warning.message
    assert stages.training is not None and found.training is not None
    # a stage keeps only its input where each block kept its own: fewer saved bytes at the loss, by the inputs of
    # the second block of each stage ([R, D] each)
    assert found.training.saved_activation_bytes - stages.training.saved_activation_bytes == 2 * R * D * 4
    with pytest.raises(TrainingOptionError, match="no numbered module level matches .*stages"):
        train(staged(), checkpoint="layers:decoder.layers")


def declaring(model: onnx.ModelProto, layers: str) -> onnx.ModelProto:
    from onnxmem.training.rules import CHECKPOINT_LAYERS_PROPERTY

    onnx.helper.set_model_props(model, {CHECKPOINT_LAYERS_PROPERTY: layers})
    return model


def test_the_modules_the_export_declares_are_the_blocks() -> None:
    # the library's own placement (transformers' GradientCheckpointingLayer, written by the export) is taken over
    # the level found: here the stages, as `layers:stages` takes them
    declared = train(declaring(staged(), "stages.0,stages.1"), checkpoint="layers")
    (warning,) = [w for w in declared.warnings if w.code == "checkpoint-layers"]
    assert "2 blocks stages.N, as the model's library checkpoints them" in warning.message
    stages = train(staged(), checkpoint="layers:stages")
    assert declared.training is not None and stages.training is not None
    assert declared.training.peak_bytes == stages.training.peak_bytes
    assert declared.training.saved_activation_bytes == stages.training.saved_activation_bytes
    # two declared levels, each block where the export names it; a level named with --checkpoint layers:PATTERN
    # is taken instead of the declared ones
    mixed = train(declaring(staged(), "stages.0.blocks.0,stages.0.blocks.1,stages.1"), checkpoint="layers")
    (warning,) = [w for w in mixed.warnings if w.code == "checkpoint-layers"]
    assert "3 blocks stages.N.blocks.N, stages.N, as" in warning.message
    named = train(declaring(staged(), "stages.0,stages.1"), checkpoint="layers:stages.*.blocks")
    (warning,) = [w for w in named.warnings if w.code == "checkpoint-layers"]
    assert "4 blocks stages.*.blocks.N" in warning.message


def test_declared_modules_the_file_does_not_name_fall_back_to_the_levels() -> None:
    report = train(declaring(staged(), "encoder.layers.0,encoder.layers.1"), checkpoint="layers")
    (warning,) = [w for w in report.warnings if w.code == "checkpoint-layers"]
    assert "4 blocks stages.*.blocks.N" in warning.message and "from the module scopes" in warning.message


def test_the_export_declares_the_outermost_checkpointing_layers() -> None:
    torch = pytest.importorskip("torch")
    from onnxmem.torch import training_properties
    from onnxmem.training.rules import CHECKPOINT_LAYERS_PROPERTY, EXPORT_MODE_PROPERTY

    class GradientCheckpointingLayer(torch.nn.Module):  # the name transformers' layers derive from
        def __init__(self, inner: torch.nn.Module | None = None) -> None:
            super().__init__()
            self.inner = inner if inner is not None else torch.nn.Linear(2, 2)

    class Block(GradientCheckpointingLayer):
        pass

    model = torch.nn.Module()
    model.conv_layers = torch.nn.ModuleList([Block(), Block()])
    model.layers = torch.nn.ModuleList([GradientCheckpointingLayer(Block())])
    model.pos = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    properties = training_properties(model)
    assert properties[EXPORT_MODE_PROPERTY] == "training"
    assert properties[CHECKPOINT_LAYERS_PROPERTY] == "conv_layers.0,conv_layers.1,layers.0"
    assert CHECKPOINT_LAYERS_PROPERTY not in training_properties(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def called(count: int = 2) -> onnx.ModelProto:
    """`count` blocks 'layers.N' (dynamo export scopes): up = x @ A [R, H], then a module call 'layers.N.act' that
    takes `up` as its argument: a = Relu(up), b = Relu(a), down = b @ B [R, D]."""
    nodes, inits, previous = [], [], "x"
    for i in range(count):
        block, act = f": pkg.M/layers.{i}: pkg.Block", f": pkg.M/layers.{i}: pkg.Block/layers.{i}.act: pkg.Act"
        inits += [graphs.external_header(f"A{i}", TensorProto.FLOAT, [D, H]),
                  graphs.external_header(f"B{i}", TensorProto.FLOAT, [H, D])]
        made = [(oh.make_node("MatMul", [previous, f"A{i}"], [f"up{i}"], name=f"up{i}"), f"{block}/mm: aten.mm"),
                (oh.make_node("Relu", [f"up{i}"], [f"a{i}"], name=f"act{i}"), f"{act}/relu: aten.relu"),
                (oh.make_node("Relu", [f"a{i}"], [f"b{i}"], name=f"again{i}"), f"{act}/relu_1: aten.relu"),
                (oh.make_node("MatMul", [f"b{i}", f"B{i}"], [f"down{i}"], name=f"down{i}"), f"{act}/mm: aten.mm")]
        for node, scope in made:
            node.metadata_props.add(key="namespace", value=scope)
            nodes.append(node)
        previous = f"down{i}"
    return graphs.model(nodes, [graphs.value("x", [R, D])], [graphs.value(previous, [R, D])], inits)


def test_the_recompute_holds_a_module_calls_arguments_as_the_forward_does() -> None:
    # `up` is read by the first ReLU only (which keeps its output, not its input), but it is the argument of the
    # call 'layers.N.act': the caller's frame holds it until the call returns, in forward and again in the
    # recompute (which stops after the second ReLU, whose output is the last tensor saved)
    layers = train(called(), checkpoint="layers", device="cuda").training
    assert layers is not None
    timeline = layers.timeline
    live = dict(zip(timeline.events, timeline.first_live_bytes, strict=False))
    # from the first ReLU to the second: + b [R, H], and `up` [R, H] still held
    assert live["recompute Relu again1"] - live["recompute Relu act1"] == R * H * 4
    assert live["Relu again1"] - live["Relu act1"] == R * H * 4

"""Sharded training (plan/sharding.py): model states per GPU and per node's CPU equal DeepSpeed's estimators to the
byte, the gathered unit is a decoder layer found from scopes, names or shapes, and the per-GPU step divides the
update's temporaries; fit --search gpus finds the fewest GPUs that fit."""

from __future__ import annotations

import onnx
import pytest

import onnxmem
from benchmarks.llm_graphs import SHAPES, make_llama
from onnxmem.errors import TargetError
from onnxmem.plan.fit import check, fit
from onnxmem.plan.sharding import (
    deepspeed_terms,
    gathered_unit,
    model_states,
    sharded_step,
)
from onnxmem.training.step import TrainingOptions
from onnxmem.views.report import TrainingParameter

# --- DeepSpeed's estimators, verbatim from deepspeed 0.16.4 (deepspeed/runtime/zero/stage_1_and_2.py and
# stage3.py); where deepspeed is installed, the real functions are compared too (test_real_deepspeed).


def ds_zero2(total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True,  # type: ignore[no-untyped-def]
             additional_buffer_factor=1.5):
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def ds_zero3(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,  # type: ignore[no-untyped-def]
             cpu_offload=True, cpu_offload_params=True, zero_init=True, additional_buffer_factor=1.5):
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = (4 * largest_layer_params)
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


# (params, largest layer): DeepSpeed's docs' worked example (bloom-3b: 2851M, 32M largest layer), a 7B and a 70B
# Llama (largest layer: one decoder layer), and a small model
MODELS = [(2_851_000_000, 32_000_000), (6_738_415_616, 202_383_360), (68_976_648_192, 855_654_400), (4096, 512)]
NODES = [(1, 1), (4, 1), (8, 1), (8, 2), (8, 4), (2, 8)]  # (GPUs per node, nodes)


@pytest.mark.parametrize("params,largest", MODELS)
@pytest.mark.parametrize("per_node,nodes", NODES)
def test_zero2_equals_deepspeeds_estimator(params: int, largest: int, per_node: int, nodes: int) -> None:
    gpus, terms = per_node * nodes, deepspeed_terms(params)
    for offload, ds_offload in (("none", False), ("optimizer", True)):
        ours = model_states(terms, "zero2", gpus, offload, gpus_per_node=per_node)
        cpu, gpu = ds_zero2(params, per_node, nodes, cpu_offload=ds_offload)
        assert ours.per_gpu_bytes == gpu, (offload, ours)
        assert ours.cpu_bytes == cpu, offload


@pytest.mark.parametrize("params,largest", MODELS)
@pytest.mark.parametrize("per_node,nodes", NODES)
@pytest.mark.parametrize("zero_init", [True, False])
def test_zero3_equals_deepspeeds_estimator(params: int, largest: int, per_node: int, nodes: int,
                                           zero_init: bool) -> None:
    gpus, terms = per_node * nodes, deepspeed_terms(params)
    if gpus == 1:
        pytest.skip("one GPU divides nothing and gathers nothing (DeepSpeed's formula still adds 4 x largest)")
    for offload, cpu_offload, offload_params in (("none", False, False), ("optimizer", True, False),
                                                 ("both", True, True)):
        ours = model_states(terms, "zero3", gpus, offload, largest, per_node, zero_init)
        cpu, gpu, largest_memory = ds_zero3(params, largest, per_node, nodes, cpu_offload, offload_params,
                                            zero_init)
        assert ours.gathered_bytes == largest_memory
        assert ours.per_gpu_bytes == gpu, (offload, ours)
        assert ours.cpu_bytes == cpu, (offload, ours)


def test_model_states_worked_by_hand() -> None:
    # 1,000 parameters under mixed precision with Adam over 4 GPUs: 16-bit weights 2,000 B, 16-bit gradients
    # 2,000, fp32 gradients 4,000, master 4,000, Adam 8,000 B; a gathered unit of 100 parameters (4 B each).
    terms = deepspeed_terms(1000)
    z1 = model_states(terms, "zero1", 4)
    # (gradients: the 16-bit ones and the fp32 partition; optimizer states: the master copy and Adam's two)
    assert (z1.weights_bytes, z1.gradient_bytes, z1.optimizer_state_bytes) == (2000, 2000 + 1000, 3000)
    z2 = model_states(terms, "zero2", 4)
    assert (z2.weights_bytes, z2.gradient_bytes, z2.optimizer_state_bytes) == (2000, 500 + 1000, 3000)
    z3 = model_states(terms, "zero3", 4, unit_elements=100)
    # zero3: the 16-bit gradients are reduce-scattered into the fp32 partition: none kept outside the unit
    assert (z3.weights_bytes, z3.gradient_bytes, z3.optimizer_state_bytes, z3.gathered_bytes) == (500, 1000, 3000, 400)
    assert z3.unsharded_bytes == 20_000 and z3.per_gpu_bytes == 4900
    off = model_states(terms, "zero3", 4, "both", unit_elements=100)
    assert off.per_gpu_bytes == 400 and off.cpu_bytes == 18_000 * 3 // 2  # one node: every GPU's states, x 1.5
    # partitions are padded: 1,001 parameters over 4 GPUs keep ceil(2,002 / 4) = 501 bytes of 16-bit weights
    assert model_states(deepspeed_terms(1001), "zero3", 4).weights_bytes == 501
    assert model_states(terms, "ddp", 4).per_gpu_bytes == 20_000
    with pytest.raises(TargetError, match="zero3 or fsdp"):
        model_states(terms, "zero2", 4, "params")
    with pytest.raises(TargetError, match="zero4"):
        model_states(terms, "zero4", 4)


def _params(specs: list[tuple[str, str, tuple[int, ...]]]) -> list[TrainingParameter]:
    out = []
    for name, module, shape in specs:
        elements = 1
        for d in shape:
            elements *= d
        out.append(TrainingParameter(name, module, shape, elements, True))
    return out


def test_gathered_unit_from_scopes_names_and_shapes() -> None:
    layer = [("q", (8, 8)), ("k", (8, 4)), ("mlp", (8, 32)), ("norm", (8,))]  # 64 + 32 + 256 + 8 = 360
    by_scope = _params([("embed", "embed", (40, 8))] + [(f"w{i}_{n}", f"model.layers.{i}.attn", s)
                                                        for i in range(3) for n, s in layer])
    unit = gathered_unit(by_scope)
    assert unit.elements == 360 and "model.layers.0" in unit.description and "module scopes" in unit.description
    by_name = _params([("embed", "", (40, 8))] + [(f"model.layers.{i}.{n}.weight", "", s)
                                                  for i in range(3) for n, s in layer])
    assert gathered_unit(by_name).elements == 360 and "parameter names" in gathered_unit(by_name).description
    # no scopes, no names: the run of identical shape sequences (3 blocks of 4 parameters)
    blocks = [(f"onnx::MatMul_{i}{n}", "", s) for i in range(3) for n, s in layer]
    by_shape = _params([("onnx::Gather_0", "", (40, 8)), *blocks, ("head", "", (8, 9))])
    unit = gathered_unit(by_shape)
    assert unit.elements == 360 and "repeated 3 times" in unit.description
    # an embedding larger than one block is gathered alone: that is the most one GPU holds at once
    big = _params([("embed", "", (100, 8))] + [(f"layers.{i}.{n}", "", s) for i in range(3) for n, s in layer])
    assert gathered_unit(big).elements == 800
    assert gathered_unit(_params([("a", "", (3, 3)), ("b", "", (4, 4))])).elements == 16  # nothing repeats


def _strip_names(model: onnx.ModelProto) -> onnx.ModelProto:
    renamed = {}
    for i, t in enumerate(model.graph.initializer):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            renamed[t.name] = t.name = f"onnx::MatMul_{i}"
    for node in model.graph.node:
        node.name = ""
        node.input[:] = [renamed.get(x, x) for x in node.input]
    return model


@pytest.mark.parametrize("strip", [False, True])
def test_llama_70b_zero3_over_8_gpus(strip: bool) -> None:
    model = make_llama(SHAPES["70b"])
    if strip:
        model = _strip_names(model)
    options = TrainingOptions(precision="amp-bf16")
    result = check(model, {"batch": 1, "seq": 2048, "past": 1}, gpu="H100-80GB", training=options, gpus=8,
                   shard="zero3")
    s = result.sharding
    assert s is not None and not result.fits
    assert result.report is not None and result.report.training is not None
    params = result.report.training.parameters
    layer = 4 * 8192 * 8192 // 4 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192  # q, o, k, v, mlp, norms
    assert s.gathered_parameters == layer == 855_654_400
    # DeepSpeed's stage-3 estimate: 4 x the largest layer + 18 x params / GPUs (about 159 GB, 148 GiB), and
    # PyTorch Adam's step counters (4 B per parameter tensor, which DeepSpeed's estimate leaves out), divided
    steps = result.report.training.optimizer_state_bytes - 8 * params
    assert 0 < steps < 4 * 1000
    assert s.per_gpu_bytes == ds_zero3(params, layer, 8, 1, cpu_offload=False)[1] + -(-steps // 8)
    assert 150e9 < s.per_gpu_bytes < 165e9
    # the foreach update's temporaries over one GPU's shard only: one fp32 copy of an eighth of the parameters
    assert s.update_temporary_bytes == -(-4 * params // 8)
    assert s.peak_bytes == result.peak_bytes > s.per_gpu_bytes
    changes = {w.change: w for w in result.what_ifs}
    assert any(w.fits for w in result.what_ifs), changes
    assert "offload optimizer states to CPU (--offload optimizer)" in changes


def test_fsdp_is_autocast_states_divided() -> None:
    model = make_llama(SHAPES["tiny"])
    options = TrainingOptions(precision="amp-bf16")
    report = onnxmem.analyze(model, {"batch": 2, "seq": 8, "past": 1}, training=options).training
    assert report is not None
    s = sharded_step(report, "fsdp", 4)
    groups = report.parameter_groups
    weights = sum(g.trainable_bytes + g.frozen_bytes for g in groups)
    assert s.weights_bytes == -(-weights // 4) and s.gradient_bytes == -(-report.gradient_bytes // 4)
    assert s.optimizer_state_bytes == -(-report.optimizer_state_bytes // 4)
    assert s.gathered_bytes == 4 * s.gathered_parameters  # bf16 parameters and gradients of one layer
    # ddp holds what the report says
    assert sharded_step(report, "ddp", 4).peak_bytes == report.peak_bytes


def test_fit_search_gpus_finds_the_fewest() -> None:
    model = make_llama(SHAPES["tiny"])
    options = TrainingOptions(precision="amp-bf16")
    dims = {"batch": 1, "seq": 8, "past": 1}
    report = onnxmem.analyze(model, dims, training=options).training
    assert report is not None
    at8 = sharded_step(report, "zero3", 8)
    budget = at8.peak_bytes
    result = fit(model, memory=f"{budget}B", search="gpus", dims=dims, training=options, shard="zero3")
    n = result.max_value
    assert 1 < n <= 8
    assert sharded_step(report, "zero3", n).peak_bytes <= budget < sharded_step(report, "zero3", n - 1).peak_bytes
    with pytest.raises(TargetError, match="--shard"):
        fit(model, memory="1GiB", search="gpus", dims=dims, training=options)


def test_real_deepspeed() -> None:
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    params, largest = MODELS[1]
    terms = deepspeed_terms(params)
    ours = model_states(terms, "zero3", 8, "optimizer", largest, 8)
    assert (ours.cpu_bytes, ours.per_gpu_bytes) == stage3.estimate_zero3_model_states_mem_needs(
        params, largest, 8, 1, True, False)[:2]
    ours2 = model_states(terms, "zero2", 8, "none", 0, 8)
    assert (ours2.cpu_bytes, ours2.per_gpu_bytes) == stage2.estimate_zero2_model_states_mem_needs(params, 8, 1, False)

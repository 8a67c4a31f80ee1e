"""The onnxruntime execution providers behind one interface (onnxmem/targets/ort/base.py): the registry, the
lookup's error, and what each provider declares."""

from __future__ import annotations

import dataclasses

import pytest

from onnxmem.errors import OnnxMemError
from onnxmem.targets.ort import DEFAULT_PROVIDER, PROVIDERS, ExecutionProvider, execution_provider
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, NO_REUSE_RULES


def test_every_provider_is_registered_under_its_own_name_and_is_frozen() -> None:
    assert DEFAULT_PROVIDER in PROVIDERS
    for name, provider in PROVIDERS.items():
        assert isinstance(provider, ExecutionProvider) and provider.name == name
        assert execution_provider(name) is provider and execution_provider(provider) is provider
        with pytest.raises(dataclasses.FrozenInstanceError):
            provider.name = "other"  # type: ignore[misc]


def test_an_unknown_provider_is_an_error_naming_the_choices() -> None:
    with pytest.raises(OnnxMemError, match="unknown provider 'rocm': choose from cuda, cpu"):
        execution_provider("rocm")


def test_a_provider_gives_its_kernels_rules_only_in_place_of_the_defaults() -> None:
    assert execution_provider("cpu").buffer_rules(DEFAULT_INFERENCE_RULES) is DEFAULT_INFERENCE_RULES
    cuda = execution_provider("cuda").buffer_rules(DEFAULT_INFERENCE_RULES)
    assert cuda is not DEFAULT_INFERENCE_RULES and "Softmax" not in cuda.in_place
    for provider in PROVIDERS.values():  # rules a caller chose are kept
        assert provider.buffer_rules(NO_REUSE_RULES) is NO_REUSE_RULES


def test_each_provider_names_its_measurement_and_imports_it_only_to_measure() -> None:
    import importlib
    import subprocess
    import sys

    for provider in PROVIDERS.values():
        module, function = provider.measurement.split(":")
        assert callable(getattr(importlib.import_module(module), function))
    code = ("import sys; from onnxmem.targets.ort import PROVIDERS\n"
            "print(sorted(m for m in sys.modules if m == 'onnxruntime' or m.startswith('onnxmem.measure')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_cpu_kernels_scratch_is_counted_on_the_cpu_provider_only() -> None:
    """LSTM's CPU kernel allocates scratch from the arena (cpu/tables.KERNEL_SCRATCH, measured on CPU); the CUDA
    provider's kernels are other code, whose scratch is not modelled: none of the CPU's is counted there."""
    from pathlib import Path

    from onnxmem.passes.pipeline import analysis

    model = Path(__file__).resolve().parent.parent / "fixtures" / "lstm.onnx"
    for name, counted in (("cpu", True), ("cuda", False)):
        analysed = analysis(model, {"batch": 8}, default_dim=8, provider=name)
        scratch = execution_provider(name).kernel_scratch(analysed.graph, analysed.loaded.proto)
        assert bool(scratch) is counted

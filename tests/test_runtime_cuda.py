"""onnxmem.measure.ort_cuda: the counting allocator by hand, the C callback glue with a fake device, and measure_cuda
against a fake onnxruntime that calls the callbacks through their addresses as the CUDA provider would.

Only the last test needs a real GPU (onnxruntime-gpu with a CUDA provider); it is skipped elsewhere.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx import TensorProto, numpy_helper

from onnxmem.errors import MissingExtraError, RuntimeMeasurementError
from onnxmem.measure import ort_cuda as cuda
from onnxmem.measure.ort_cuda import (
    ALLOC_FN,
    EMPTY_CACHE_FN,
    FREE_FN,
    AllocationCounter,
    AllocatorHooks,
    load_cudart,
    measure_cuda,
    require_cudart,
)


def _has_cuda_provider() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


# ---------------------------------------------------------------------------------------------------------------
# AllocationCounter, hand-worked


def test_counter_phases_and_peaks():
    c = AllocationCounter()
    c.mark("session")
    c.alloc(0x10, 1000)  # weights
    c.alloc(0x20, 24)  # something the provider keeps
    c.mark("run0")  # live 1024
    c.alloc(0x30, 100)  # 1124
    c.alloc(0x40, 200)  # 1324 <- run0 peak
    c.free(0x30)  # 1224
    c.alloc(0x50, 50)  # 1274
    c.free(0x40)  # 1074
    c.free(0x50)  # 1024
    c.mark("run1")
    c.alloc(0x30, 300)  # address reused after its free: fine, 1324
    c.free(0x30)  # 1024
    c.mark("teardown")
    c.free(0x10)
    c.free(0x20)
    s = c.summary()
    assert [p.label for p in s.phases] == ["setup", "session", "run0", "run1", "teardown"]
    setup, session, run0, run1, teardown = s.phases
    assert (setup.start_bytes, setup.peak_bytes, setup.end_bytes, setup.allocations) == (0, 0, 0, 0)
    assert (session.start_bytes, session.peak_bytes, session.end_bytes) == (0, 1024, 1024)
    assert (session.allocations, session.allocated_bytes, session.frees) == (2, 1024, 0)
    assert (run0.start_bytes, run0.peak_bytes, run0.end_bytes, run0.peak_delta_bytes) == (1024, 1324, 1024, 300)
    assert (run0.allocations, run0.allocated_bytes, run0.frees, run0.freed_bytes) == (3, 350, 3, 350)
    assert (run1.peak_delta_bytes, run1.allocations, run1.allocated_bytes) == (300, 1, 300)
    assert (teardown.start_bytes, teardown.end_bytes, teardown.frees, teardown.freed_bytes) == (1024, 0, 2, 1024)
    assert (s.live_bytes, s.peak_bytes, s.live_allocations) == (0, 1324, 0)
    assert (s.allocations, s.allocated_bytes, s.frees, s.freed_bytes) == (6, 1674, 6, 1674)
    assert s.events == 12 and c.events == 12
    assert s.error_count == 0 and s.errors == ()
    assert s.phase("run0") == run0
    with pytest.raises(KeyError):
        s.phase("run7")


def test_counter_live_and_peak_properties_follow_events():
    c = AllocationCounter()
    c.alloc(1, 10)
    c.alloc(2, 5)
    assert (c.live_bytes, c.peak_bytes) == (15, 15)
    c.free(1)
    assert (c.live_bytes, c.peak_bytes) == (5, 15)
    c.alloc(3, 7)
    assert (c.live_bytes, c.peak_bytes) == (12, 15)
    assert c.phases[-1].end_bytes == 12  # the current phase reports what is live now


def test_peak_of_a_phase_starts_at_its_start_not_at_the_global_peak():
    c = AllocationCounter()
    c.alloc(1, 500)
    c.free(1)
    c.mark("later")
    c.alloc(2, 10)
    later = c.summary().phase("later")
    assert (later.start_bytes, later.peak_bytes, later.peak_delta_bytes) == (0, 10, 10)
    assert c.peak_bytes == 500


def test_unknown_free_is_an_error_and_changes_nothing():
    c = AllocationCounter()
    c.alloc(0x10, 64)
    c.mark("run0")
    c.free(0xDEAD)
    s = c.summary()
    assert s.live_bytes == 64 and s.frees == 0 and s.events == 2
    assert s.error_count == 1
    (err,) = s.errors
    assert (err.kind, err.ptr, err.size, err.phase, err.event) == ("unknown_free", 0xDEAD, 0, "run0", 2)


def test_double_free_is_told_apart_from_unknown_free():
    c = AllocationCounter()
    c.alloc(0x10, 64)
    c.free(0x10)
    c.free(0x10)
    s = c.summary()
    assert s.live_bytes == 0 and s.frees == 1 and s.freed_bytes == 64
    assert [e.kind for e in s.errors] == ["double_free"]
    # Handed out again after the free: no longer "freed", so one free is fine and a second is a double free again.
    c.alloc(0x10, 8)
    c.free(0x10)
    assert c.summary().error_count == 1
    c.free(0x10)
    assert [e.kind for e in c.summary().errors] == ["double_free", "double_free"]


def test_zero_size_allocations_are_counted_but_add_no_bytes():
    c = AllocationCounter()
    c.alloc(0x10, 0)  # a real pointer to nothing: tracked, so its free is not unknown
    c.alloc(0, 0)  # cudaMalloc(0) may give NULL: counted, nothing to track
    s = c.summary()
    assert (s.allocations, s.allocated_bytes, s.live_bytes, s.peak_bytes, s.live_allocations) == (2, 0, 0, 0, 1)
    c.free(0x10)
    s = c.summary()
    assert (s.frees, s.live_allocations, s.error_count) == (1, 0, 0)


def test_null_free_is_ignored_and_failed_alloc_is_an_error():
    c = AllocationCounter()
    c.free(0)
    c.alloc(0, 4096)  # NULL for a non-zero size: the allocation failed
    c.empty_cache()
    s = c.summary()
    assert (s.null_frees, s.allocations, s.live_bytes, s.empty_cache_calls, s.events) == (1, 0, 0, 1, 3)
    assert [(e.kind, e.size) for e in s.errors] == [("alloc_failed", 4096)]


def test_pointer_handed_out_twice_replaces_the_stale_entry():
    c = AllocationCounter()
    c.alloc(0x10, 100)
    c.alloc(0x10, 30)  # the free in between was missed
    s = c.summary()
    assert (s.live_bytes, s.live_allocations, s.peak_bytes) == (30, 1, 100)
    assert [(e.kind, e.ptr, e.size) for e in s.errors] == [("live_pointer_reused", 0x10, 30)]


def test_negative_size_is_a_programming_error():
    with pytest.raises(ValueError):
        AllocationCounter().alloc(1, -1)


def test_stored_errors_are_capped_but_all_counted():
    c = AllocationCounter()
    for i in range(250):
        c.free(1000 + i)
    s = c.summary()
    assert s.error_count == 250 and len(s.errors) == cuda._MAX_STORED_ERRORS


# ---------------------------------------------------------------------------------------------------------------
# The C callbacks, with a fake device


class FakeDevice:
    """Hands out fake device pointers; optionally fails allocations above a limit."""

    def __init__(self, limit: int | None = None, context_bytes: int | None = None) -> None:
        self.next = 0x7F00_0000_0000
        self.live: dict[int, int] = {}
        self.freed: list[int] = []
        self.limit = limit
        self.context_bytes = context_bytes

    def malloc(self, size: int) -> int:
        if self.limit is not None and size > self.limit:
            return 0
        ptr = self.next
        self.next += max(size, 1) + 256
        self.live[ptr] = size
        return ptr

    def free(self, ptr: int) -> None:
        self.live.pop(ptr, None)
        self.freed.append(ptr)

    def create_context(self) -> int | None:
        return self.context_bytes


def _c_functions(hooks: AllocatorHooks) -> tuple[Any, Any, Any]:
    """Foreign function objects made from the bare addresses, as C code holding the addresses would call them."""
    options = hooks.provider_options()
    return (ALLOC_FN(int(options["gpu_external_alloc"])), FREE_FN(int(options["gpu_external_free"])),
            EMPTY_CACHE_FN(int(options["gpu_external_empty_cache"])))


def test_callbacks_route_through_the_counter_via_their_addresses():
    device, counter = FakeDevice(), AllocationCounter()
    hooks = AllocatorHooks(device, counter)
    alloc, free, empty_cache = _c_functions(hooks)
    counter.mark("run0")
    a = alloc(1000)
    b = alloc(24)
    assert a and b and a != b
    assert device.live == {a: 1000, b: 24}
    free(a)
    empty_cache()
    free(None)  # free(NULL) is passed on as a no-op
    s = counter.summary()
    assert (s.live_bytes, s.peak_bytes, s.allocations, s.frees, s.null_frees, s.empty_cache_calls) == (
        24, 1024, 2, 1, 1, 1)
    assert device.freed == [a]  # NULL never reaches the device
    assert s.error_count == 0


def test_callback_reports_failed_allocation_as_null():
    device, counter = FakeDevice(limit=100), AllocationCounter()
    alloc, _, _ = _c_functions(AllocatorHooks(device, counter))
    assert alloc(101) is None  # NULL: onnxruntime turns it into an error
    s = counter.summary()
    assert s.live_bytes == 0 and [e.kind for e in s.errors] == ["alloc_failed"]


def test_callback_survives_a_raising_device():
    class Broken(FakeDevice):
        def malloc(self, size: int) -> int:
            raise RuntimeError("boom")

        def free(self, ptr: int) -> None:
            raise RuntimeError("boom")

    counter = AllocationCounter()
    alloc, free, _ = _c_functions(AllocatorHooks(Broken(), counter))
    assert alloc(8) is None
    free(0x1234)  # unknown to the counter; the device raises; nothing escapes into "C"
    assert [e.kind for e in counter.summary().errors] == ["alloc_failed", "unknown_free"]


def test_addresses_are_distinct_integers():
    hooks = AllocatorHooks(FakeDevice(), AllocationCounter())
    addresses = {hooks.alloc_address, hooks.free_address, hooks.empty_cache_address}
    assert len(addresses) == 3 and all(isinstance(a, int) and a > 0 for a in addresses)
    assert hooks.provider_options()["gpu_external_alloc"] == str(hooks.alloc_address)


# ---------------------------------------------------------------------------------------------------------------
# Finding libcudart


def test_load_cudart_gives_none_when_nothing_is_found(tmp_path):
    assert load_cudart(names=("libonnxmem-no-such-cudart.so.99",), dirs=[tmp_path]) is None


def test_require_cudart_raises_one_line_naming_the_gpu_extra(tmp_path):
    with pytest.raises(MissingExtraError) as info:
        require_cudart(names=("libonnxmem-no-such-cudart.so.99",), dirs=[tmp_path])
    message = str(info.value)
    assert "\n" not in message and "onnxmem[gpu]" in message and "libonnxmem-no-such-cudart.so.99" in message


def test_cudart_search_dirs_include_the_nvidia_wheels(tmp_path, monkeypatch):
    (tmp_path / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "cuda_runtime" / "lib").mkdir(parents=True)
    monkeypatch.setattr(cuda.site, "getsitepackages", lambda: [str(tmp_path)])
    dirs = cuda._cudart_dirs()
    assert tmp_path / "nvidia" / "cu13" / "lib" in dirs
    assert tmp_path / "nvidia" / "cuda_runtime" / "lib" in dirs


def test_default_search_finds_nothing_when_dirs_are_empty(monkeypatch):
    monkeypatch.setattr(cuda, "_cudart_dirs", lambda: [])
    assert load_cudart(names=("libonnxmem-no-such-cudart.so.99",)) is None


# ---------------------------------------------------------------------------------------------------------------
# measure_cuda without a GPU


def _model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           oh.make_node("Relu", ["h"], ["y"], name="relu")], "g",
                          [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[w])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_measure_cuda_without_cuda_provider_names_the_gpu_extra(monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(MissingExtraError) as info:
        measure_cuda(_model(), {"x": np.ones((1, 4), np.float32)})
    message = str(info.value)
    assert "\n" not in message
    assert 'onnxmem[gpu]' in message and "onnxruntime-gpu" in message and "CUDA 13" in message


def test_measure_cuda_without_onnxruntime_names_the_gpu_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    with pytest.raises(MissingExtraError) as info:
        measure_cuda(_model(), {})
    assert "onnxruntime-gpu" in str(info.value) and "onnxmem[gpu]" in str(info.value)


def test_measure_cuda_rejects_bad_arguments():
    with pytest.raises(ValueError):
        measure_cuda(_model(), {}, opt_level="max")
    with pytest.raises(ValueError):
        measure_cuda(_model(), {}, runs=0)
    with pytest.raises(ValueError):
        measure_cuda(_model(), {}, device_id=-1)


class _Enum:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __getattr__(self, name: str) -> str:
        return f"{self.prefix}.{name}"


def _fake_ort(*, fall_back: bool = False, fail_load: bool = False, fail_run: bool = False,
              seen: dict[str, Any] | None = None) -> types.ModuleType:
    """An onnxruntime stand-in whose session allocates through the provider options' external allocator.

    Session: weights 64 bytes (the 4x4 float initializer) + 32 bytes of provider state.
    Each run: input copy 16, h 16, y 16 (free h), copy y back and free y and x: peak above start 48.
    """
    seen = {} if seen is None else seen
    module = types.ModuleType("onnxruntime")
    module.__version__ = "0.0-fake"  # type: ignore[attr-defined]
    module.get_available_providers = lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]  # type: ignore
    module.preload_dlls = lambda: seen.setdefault("preloaded", True)  # type: ignore[attr-defined]
    module.GraphOptimizationLevel = _Enum("GraphOptimizationLevel")  # type: ignore[attr-defined]
    module.ExecutionMode = _Enum("ExecutionMode")  # type: ignore[attr-defined]
    module.ExecutionOrder = _Enum("ExecutionOrder")  # type: ignore[attr-defined]

    class SessionOptions:
        def add_session_config_entry(self, key, value):
            seen.setdefault("config", {})[key] = value

    class InferenceSession:
        def __init__(self, source, sess_options, providers, provider_options):
            if fail_load:
                raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL :\n Load model failed:\n bad graph")
            self.options = dict(provider_options[0])
            seen["options"] = self.options
            seen["profile_prefix"] = sess_options.profile_file_prefix
            self.alloc = ALLOC_FN(int(self.options["gpu_external_alloc"]))
            self.free = FREE_FN(int(self.options["gpu_external_free"]))
            self.kept = [self.alloc(64), self.alloc(32)]
            self.runs: list[tuple[int, int]] = []
            self.clock = 1000

        def get_providers(self):
            return ["CPUExecutionProvider"] if fall_back else ["CUDAExecutionProvider", "CPUExecutionProvider"]

        def get_provider_options(self):
            return {"CUDAExecutionProvider": dict(self.options)}

        def run(self, outputs, feeds):
            if fail_run:
                raise RuntimeError("CUDA failure 2: out of memory\n GPU=0")
            start = self.clock
            x = self.alloc(16)
            h = self.alloc(16)
            y = self.alloc(16)
            self.free(h)
            self.free(x)
            self.free(y)
            self.clock += 100
            self.runs.append((start, self.clock))
            return [np.zeros((1, 4), np.float32)]

        def end_profiling(self):
            events = []
            for start, end in self.runs:
                events.append({"cat": "Node", "name": "mm_kernel_time", "ts": start + 10, "dur": 5,
                               "args": {"provider": "CUDAExecutionProvider"}})
                events.append({"cat": "Node", "name": "relu_kernel_time", "ts": start + 20, "dur": 5,
                               "args": {"provider": "CPUExecutionProvider"}})
                events.append({"cat": "Session", "name": "model_run", "ts": start, "dur": end - start - 1})
            path = Path(seen["profile_prefix"] + "_fake.json")
            path.write_text(json.dumps(events), encoding="utf-8")
            return str(path)

        def __del__(self):
            for ptr in getattr(self, "kept", []):
                self.free(ptr)

    module.SessionOptions = SessionOptions  # type: ignore[attr-defined]
    module.InferenceSession = InferenceSession  # type: ignore[attr-defined]
    return module


@pytest.fixture
def fake_device(monkeypatch):
    device = FakeDevice(context_bytes=12345)
    monkeypatch.setattr(cuda, "_make_backend", lambda device_id: device)
    return device


def test_measure_cuda_counts_through_the_callbacks(monkeypatch, fake_device, tmp_path):
    seen: dict[str, Any] = {}
    monkeypatch.setitem(sys.modules, "onnxruntime", _fake_ort(seen=seen))
    monkeypatch.chdir(tmp_path)
    r = measure_cuda(_model(), {"x": np.ones((1, 4), np.float32)}, runs=2, device_id=0)
    assert r.session_bytes == 96 and r.session_peak_bytes == 96
    assert [(run.run_index, run.peak_activation_bytes, run.start_bytes, run.end_bytes) for run in r.runs] == [
        (0, 48, 96, 96), (1, 48, 96, 96)]
    assert r.first_run is r.runs[0] and r.steady_run is r.runs[1]
    assert r.context_bytes == 12345
    assert r.execution_order == ("mm", "relu") and r.cpu_fallback_nodes == ("relu",)
    teardown = r.counter.phase("teardown")
    assert teardown.end_bytes == 0 and teardown.frees == 2  # the session's memory went back when it was deleted
    assert r.counter.error_count == 0 and fake_device.live == {}
    assert seen["preloaded"] is True
    options = seen["options"]
    assert options["cudnn_conv_algo_search"] == "HEURISTIC" and options["cudnn_conv_use_max_workspace"] == "0"
    assert options["arena_extend_strategy"] == "kSameAsRequested" and options["device_id"] == "0"
    assert all(options[k].isdigit() for k in ("gpu_external_alloc", "gpu_external_free", "gpu_external_empty_cache"))
    assert r.settings["cuda.cudnn_conv_algo_search"] == "HEURISTIC"
    assert r.settings["intra_op_num_threads"] == "1" and r.settings["execution_mode"] == "ORT_SEQUENTIAL"
    assert r.settings["graph_optimization_level"] == "ORT_DISABLE_ALL" and r.settings["enable_mem_pattern"] == "True"
    # The profile lived in a temporary directory that is gone, and nothing was written in the working directory.
    assert not Path(seen["profile_prefix"]).parent.exists()
    assert list(tmp_path.iterdir()) == []


def test_validate_on_cuda_compares_the_counted_runs_with_the_estimate(monkeypatch, fake_device, tmp_path):
    import onnxmem

    monkeypatch.setitem(sys.modules, "onnxruntime", _fake_ort())
    monkeypatch.chdir(tmp_path)
    v = onnxmem.validate(_model(), provider="cuda", runs=2)
    planned = onnxmem.analyze(_model()).inference.peak_activation_bytes
    first = v.runs[0]
    assert v.provider == "cuda" and first.phase == "first" and v.runs[1].phase == "steady"
    # the fake session's runs peak 48 bytes above their start; the estimate adds the 16-byte input to the plan
    assert first.measured.peak_activation_bytes == 48
    assert first.estimated.peak_activation_bytes == planned + 16
    assert first.activation_difference_bytes == planned + 16 - 48
    # weights: every initializer on the device (64 bytes) against what the session kept (96: 32 of provider state)
    assert first.estimated.weights_bytes == 64 and first.measured.weights_bytes == 96
    assert first.weights_difference_bytes == -32
    assert any("CUDA context" in n for n in v.notes) and any("CPU provider" in n for n in v.notes)
    assert v.settings["execution_provider"] == "CUDAExecutionProvider"
    assert list(tmp_path.iterdir()) == []


def test_measure_cuda_refuses_a_silent_cpu_fallback(monkeypatch, fake_device):
    monkeypatch.setitem(sys.modules, "onnxruntime", _fake_ort(fall_back=True))
    with pytest.raises(RuntimeMeasurementError, match="could not create the CUDA execution provider"):
        measure_cuda(_model(), {"x": np.ones((1, 4), np.float32)})
    assert fake_device.live == {}


def test_measure_cuda_refuses_a_provider_that_ignored_the_allocator(monkeypatch, fake_device):
    module = _fake_ort()
    real_options = module.InferenceSession.get_provider_options

    def ignored(self):
        options = real_options(self)
        options["CUDAExecutionProvider"]["gpu_external_alloc"] = "0"
        return options

    monkeypatch.setattr(module.InferenceSession, "get_provider_options", ignored)
    monkeypatch.setitem(sys.modules, "onnxruntime", module)
    with pytest.raises(RuntimeMeasurementError, match="did not take the counting allocator"):
        measure_cuda(_model(), {"x": np.ones((1, 4), np.float32)})


@pytest.mark.parametrize("kind, text", [("load", "cannot load the model: [ONNXRuntimeError] : 1 : FAIL : Load"),
                                        ("run", "cannot run the model: CUDA failure 2: out of memory GPU=0")])
def test_measure_cuda_reports_onnxruntime_failures_on_one_line(monkeypatch, fake_device, kind, text):
    monkeypatch.setitem(sys.modules, "onnxruntime", _fake_ort(fail_load=kind == "load", fail_run=kind == "run"))
    with pytest.raises(RuntimeMeasurementError) as info:
        measure_cuda(_model(), {"x": np.ones((1, 4), np.float32)})
    assert "\n" not in str(info.value) and text in str(info.value)
    assert fake_device.live == {}  # the session was released even though it failed


# ---------------------------------------------------------------------------------------------------------------
# A real GPU


@pytest.mark.skipif(not _has_cuda_provider(), reason="needs onnxruntime-gpu with a CUDA provider and a GPU")
def test_real_cuda_counts_weights_and_frees_everything():
    n = 1024
    w = numpy_helper.from_array(np.ones((n, n), np.float32), "w")  # 4 MiB on the device
    graph = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [oh.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], initializer=[w])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    r = measure_cuda(model, {"x": np.ones((n, n), np.float32)}, runs=2)
    t = 4 * n * n
    assert r.session_bytes >= t
    assert r.first_run.peak_activation_bytes >= 2 * t  # the input's device copy and the output
    assert r.counter.error_count == 0
    assert r.counter.phase("teardown").end_bytes == 0
    assert r.execution_order and "mm" in r.execution_order


def test_validate_on_cuda_plans_with_the_cuda_kernels_rules(monkeypatch, fake_device, tmp_path):
    """validate --provider cuda's estimate runs the declared stages with the CUDA provider's buffer rules, as
    `onnxmem report --provider cuda` does (it planned with the CPU provider's rules before)."""
    import onnxmem
    from onnxmem.passes import pipeline
    from onnxmem.targets.ort.cuda.provider import CUDA_INFERENCE_RULES

    planned: list[object] = []

    def liveness(run: pipeline.PipelineRun) -> None:
        planned.append(run.buffer_rules)
        pipeline._liveness(run)

    monkeypatch.setattr(pipeline, "STAGES", tuple(pipeline.Stage(s.name, liveness) if s.name == "liveness" else s
                                                  for s in pipeline.STAGES))
    monkeypatch.setitem(sys.modules, "onnxruntime", _fake_ort())
    monkeypatch.chdir(tmp_path)
    onnxmem.validate(_model(), provider="cuda", runs=2)
    assert planned and all(rules is CUDA_INFERENCE_RULES for rules in planned)  # (the estimate, the raw report)

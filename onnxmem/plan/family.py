"""A model's reports over the values of one dim (batch, seq), reusing the work that does not depend on it.

Shape inference is the costly pass and the only one that depends on the dims. In nearly every model each
tensor dim is an affine function of the searched dim (batch: b, 8b; sequence: s, s + past), so the family
infers shapes at three probe values, fits every dim as base + slope x value from the first two, and keeps
the fit only if the third probe agrees for every tensor. Each buffer's bytes are then a polynomial in the
value (a product of affine dims times the element size), and so is the live total at every step: the peak at
any value is the largest of those step polynomials, found among the few that no other step dominates
coefficient by coefficient. The buffer plan (views, in-place writes, reuse of freed buffers, lifetimes) is taken
from the first probe and kept only when every buffer's members have the same polynomial, and at each value only
when no two tensors of different shapes at the probe happen to have equal shapes there (reuse needs equal shapes).
Anything else (a conv stride's floor division, a subgraph, a packed 4-bit tensor, a dim that is not affine)
falls back to full analysis at each value. `report(value, exact=True)` always does the full analysis.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from onnxmem.ir.dtypes import element_bits, tensor_bytes
from onnxmem.ir.graph import INPUT, WEIGHT, ModelGraph
from onnxmem.ir.load import LoadedModel
from onnxmem.ir.tensor_types import UNKNOWN_TYPE, Dim, TensorType
from onnxmem.passes.liveness import Timeline, live_bytes
from onnxmem.passes.orders import DEFAULT_ORDER
from onnxmem.passes.pipeline import (
    Analysis,
    PipelineRun,
    Schedules,
    Sizing,
    after_sizing,
    analysis,
    model_name,
    run_stages,
    size_warnings,
    sizing,
)
from onnxmem.shapes.dims import InputDim, bind_dims, input_dims
from onnxmem.shapes.kvcache import genai_dims
from onnxmem.shapes.sizing import bind_and_infer
from onnxmem.targets.ort import DEFAULT_PROVIDER, ExecutionProvider, execution_provider
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES
from onnxmem.views.report import Report, Warning

# Small primes: unlikely to equal a constant of the model. Where two shapes happen to coincide at a probe (16 and
# seq + 5 at seq = 11), the buffer plan there is not the general one, and the next triple is tried.
_PROBE_TRIPLES = ((7, 11, 13), (17, 19, 23), (29, 31, 37))
Probes = tuple[int, int, int]
Affine = tuple[tuple[int, int], ...]  # per dim: (base, slope); dim(value) = base + slope * value
Poly = tuple[int, ...]  # coefficients of value**0, value**1, ...


@dataclass(frozen=True)
class _Template:
    graph: ModelGraph  # at the first probe
    dims: list[Affine | None]  # per tensor; None: size unknown at every probe
    frontier: list[Poly]  # live-bytes polynomials of the steps that no other step dominates
    warnings: list[Warning]
    signatures: list[tuple[int, Affine]]  # distinct (element bits, affine shape) of the sized tensors
    plan_shapes: list[tuple[Dim, ...] | None] | None  # symbolic shapes the planner compares (None: bound ones)
    weights_bytes: int
    input_polys: list[Poly]  # bytes of each graph input as a polynomial of the value
    size_warnings: list[Warning]  # the activations the plan could not size (the same at every value)
    schedules: Schedules  # the orders of its graph's wiring, shared by the Sizings made from it
    timeline: Timeline  # at the first probe: its buffer plan and lifetimes hold at every value where plan_holds

    def plan_holds(self, value: int) -> bool:
        """Say whether the buffer plan of the first probe holds at `value`: reuse and in-place need equal shapes,
        and two tensors whose shapes differ at the probe must not happen to be equal here. A plan made on the
        symbolic shapes (as onnxruntime's) does not depend on the value."""
        if self.plan_shapes is not None:
            return True
        seen = {(bits, tuple(base + slope * value for base, slope in affine)) for bits, affine in self.signatures}
        return len(seen) == len(self.signatures)


class ModelFamily:
    """Reports of one model at every value of one searched dim, the other dims fixed."""

    def __init__(self, model: str | os.PathLike[str] | onnx.ModelProto, search: str,
                 dims: Mapping[str, int] | None = None, **options: Any) -> None:
        # the model as onnxruntime runs it on the provider (ExecutionProvider.runtime_model: its QDQ copies, the
        # CPU provider's float16 Casts, the CUDA provider's placement), made once for every value; the model as
        # given is kept for the training step, which reads it (see pipeline.after_sizing)
        self.provider: ExecutionProvider = execution_provider(options.get("provider", DEFAULT_PROVIDER))
        made = run_stages(PipelineRun(self.provider, options.get("rules", DEFAULT_INFERENCE_RULES), model=model),
                          "load", "provider")
        given, self._provider_notes = made.given, made.notes
        assert given is not None and made.loaded is not None
        self.loaded: LoadedModel = made.loaded
        self._given = given if self.loaded is not given else None
        self.search = search
        self.dims = dict(dims or {})
        self.options = options  # analyze()'s keywords: default_dim, order, rules, ...
        self._reports: dict[tuple[int, bool], Report] = {}
        self._free: list[InputDim] | None = None  # the model's input_dims, read at first use
        self._template: _Template | None | bool = False  # False: not built yet; None: not affine
        self._symbolic_types: Mapping[str, TensorType] | None | bool = False  # False: not inferred yet
        # (the dims the model's side files state, as the pipeline binds them, unless given)
        implied, said = genai_dims(self.loaded.path, self.free_dims())
        self._implied_note = said if implied.keys() - self.dims.keys() else ()
        self.dims = {**implied, **self.dims}

    @property
    def affine(self) -> bool:
        """Say whether sizes follow the searched dim affinely (probed and verified at three values)."""
        return self._affine_template() is not None

    def report(self, value: int, exact: bool = False) -> Report:
        """Give the report with the searched dim bound to `value`; exact=True redoes shape inference."""
        key = (value, exact)
        if key not in self._reports:
            template = None if exact else self._affine_template()
            if template is None or not template.plan_holds(value):
                self._reports[key] = self._exact_analysis(value).report
            else:
                self._reports[key] = self._fast_report(template, value)
        return self._reports[key]

    def peak_activation_bytes(self, value: int) -> int:
        """Give the inference activation peak at `value`: a few polynomial evaluations when affine."""
        template = self._affine_template()
        if template is None or not template.plan_holds(value):
            return self.report(value, exact=True).inference.peak_activation_bytes
        return max((_evaluate(poly, value) for poly in template.frontier), default=0)

    def inference_peak_bytes(self, value: int) -> tuple[int, int]:
        """Give (weights + inputs + activation peak, weights) at `value`: cheap when the family is affine."""
        template = self._affine_template()
        if template is None or not template.plan_holds(value):
            inference = self.report(value).inference
            return inference.peak_bytes, inference.weights_bytes
        inputs = sum(_evaluate(poly, value) for poly in template.input_polys)
        return template.weights_bytes + inputs + self.peak_activation_bytes(value), template.weights_bytes

    def free_dims(self) -> list[InputDim]:
        """Give the model's symbolic input dims (dims.input_dims), read once (a KV cache has thousands of inputs)."""
        if self._free is None:
            self._free = input_dims(self.loaded.proto)
        return self._free

    def _binding(self, value: int) -> dict[str, int]:
        return {**self.dims, self.search: value}

    def _affine_template(self) -> _Template | None:
        if self._template is False:
            # Options the fast path does not model (training brings passes of its own) take the exact path.
            modelled = not set(self.options) - {"default_dim", "order", "rules", "provider"}
            self._template = self._build_template() if modelled else None
        return self._template  # type: ignore[return-value]

    def _build_template(self) -> _Template | None:
        for probes in _PROBE_TRIPLES:
            template = self._template_at(probes)
            if template is not False:
                return template  # type: ignore[return-value]
        return None

    def _template_at(self, probes: Probes) -> _Template | None | bool:
        """Give the template probed at three values, None where the family is not affine, False where two
        shapes coincide at a probe (try other probes)."""
        default_dim = self.options.get("default_dim")
        free = self.free_dims()
        order = self.options.get("order", DEFAULT_ORDER)
        # the declared stages from the graph to the timeline, at the first probe (pipeline.STAGES): the planner
        # types found there serve every template and value
        run = PipelineRun(self.provider, self.options.get("rules", DEFAULT_INFERENCE_RULES),
                          self._binding(probes[0]), default_dim, order, loaded=self.loaded, given=self.loaded,
                          notes=list(self._provider_notes), free=free)
        if not isinstance(self._symbolic_types, bool):
            run.symbolic, run.symbolic_made = self._symbolic_types, True
        first = run_stages(run, "graph", "size").sized
        assert first is not None and run.graph is not None
        graph, symbolic = run.graph, run.symbolic
        self._symbolic_types = symbolic
        if any(op.subgraphs for op in graph.ops):
            return None
        shapes = [[t.shape for t in graph.tensors]]
        for probe in probes[1:]:
            types = bind_and_infer(self.loaded.proto, self._binding(probe), default_dim, symbolic=symbolic,
                                   graph=graph, free=free).types
            shapes.append([types.get(t.name, UNKNOWN_TYPE)[1] for t in graph.tensors])
        bits = {dtype: element_bits(dtype) for dtype in {t.dtype for t in graph.tensors}}  # (asked per tensor below)
        dims: list[Affine | None] = []
        fitted: dict[tuple[tuple[Dim, ...] | None, ...], Affine | None] = {}  # layers repeat their shapes
        for tensor, probed in zip(graph.tensors, zip(*shapes, strict=True), strict=True):
            if tensor.nbytes is None and all(s is None or not _all_ints(s) for s in probed):
                dims.append(None)
                continue
            if probed not in fitted:
                fitted[probed] = _fit_affine(probed, probes)
            affine = fitted[probed]
            if affine is None or bits[tensor.dtype] not in (8, 16, 32, 64, 128):
                return None
            dims.append(affine)
        plan_shapes = None if first.plan_shapes is None else list(first.plan_shapes)
        # the orders of this wiring, made once for every value (the first here)
        schedules = Schedules(graph.ops)
        run.sized = dataclasses.replace(first, schedules=schedules)
        run_stages(run, "order", "liveness")
        timeline = run.timeline
        assert timeline is not None
        made: dict[tuple[Affine, int], Poly] = {}  # layers repeat their shapes
        polys: list[Poly | None] = []
        for tensor, d in zip(graph.tensors, dims, strict=True):
            if d is None:
                polys.append(None)
                continue
            key = (d, bits[tensor.dtype] or 0)
            if key not in made:
                made[key] = _bytes_poly(*key)
            polys.append(made[key])
        for t, owner in enumerate(timeline.buffer_of):
            if owner >= 0 and polys[t] is not None and polys[t] != polys[owner]:
                return None  # a buffer shared by tensors whose sizes diverge: the plan may change with value
        if any(timeline.subgraph_bytes):
            return None
        signatures = sorted({(bits[t.dtype] or 0, d) for t, d in zip(graph.tensors, dims, strict=True)
                             if d is not None})
        weights = sum(t.nbytes or 0 for t in graph.tensors if t.kind == WEIGHT)
        inputs = [p for t, p in zip(graph.tensors, polys, strict=True) if t.kind == INPUT and p is not None]
        template = _Template(graph, dims, _frontier(_step_polys(timeline, polys)), list(first.warnings),
                             signatures, plan_shapes, weights, inputs, size_warnings(graph, timeline),
                             schedules, timeline)
        return template if all(template.plan_holds(p) for p in probes) else False

    def arena_inputs(self, value: int) -> tuple[ModelGraph, Timeline, list[int | None] | None,
                                                Callable[[int], tuple[int, ...] | None] | None]:
        """Give what arena.session_held_bytes reads at `value`: a graph, its timeline, and each tensor's bytes and
        shape where not the graph's own. Where the plan holds: the template's graph and timeline (value-free but
        for sizes), with the sizes at `value` (no graph is built); else the full analysis's."""
        template = self._affine_template()
        if template is None or not template.plan_holds(value):
            analysed = self._exact_analysis(value)
            return analysed.graph, analysed.timeline, None, None
        made: dict[tuple[Affine, int], int | None] = {}  # layers repeat their shapes
        sizes: list[int | None] = []
        for tensor, affine in zip(template.graph.tensors, template.dims, strict=True):
            if affine is None:
                sizes.append(None)
                continue
            key = (affine, tensor.dtype)
            if key not in made:
                count = 1
                for base, slope in affine:
                    count *= max(base + slope * value, 0)
                made[key] = tensor_bytes(tensor.dtype, count)
            sizes.append(made[key])

        def shape_of(t: int) -> tuple[int, ...] | None:
            affine = template.dims[t]  # (a tensor the ops read is never omitted here)
            return () if affine is None else tuple(max(base + slope * value, 0) for base, slope in affine)

        return template.graph, template.timeline, sizes, shape_of

    def sizing(self, value: int) -> Sizing:
        """Give the Sizing at `value` (analyze.sizing's): from the template where it serves, with no inference."""
        template = self._affine_template()
        if template is None or not template.plan_holds(value):
            return self._exact_sizing(value)
        default_dim = self.options.get("default_dim")
        free = self.free_dims()
        bound, _ = bind_dims(free, self._binding(value), default_dim)
        plan_shapes = None if template.plan_shapes is None else tuple(template.plan_shapes)
        return Sizing(self.loaded, self._sized_graph(template, value), bound, plan_shapes, tuple(template.warnings),
                      self._symbolic_types or None, tuple(free), default_dim,  # type: ignore[arg-type]
                      self.provider, schedules=template.schedules)

    def _exact_sizing(self, value: int) -> Sizing:
        """Give analyze.sizing's Sizing at `value` (its inference redone), of the model as given (see __init__)."""
        sized = sizing(self.loaded, self._binding(value), default_dim=self.options.get("default_dim"),
                       rules=self.options.get("rules", DEFAULT_INFERENCE_RULES),
                       provider=self.provider)
        # (its orders are shared by the analyses fit makes of it: its what-ifs)
        return dataclasses.replace(sized, given=self._given or sized.given, schedules=Schedules(sized.graph.ops))

    def _exact_analysis(self, value: int) -> Analysis:
        """Give the full analysis at `value` (analyze.analysis's, its inference redone)."""
        return analysis(self._exact_sizing(value), order=self.options.get("order", DEFAULT_ORDER),
                        rules=self.options.get("rules", DEFAULT_INFERENCE_RULES), training=self.options.get("training"))

    def header(self, value: int) -> tuple[str, dict[str, int], tuple[Warning, ...]]:
        """Give the model's name, the bound dims and the warnings of the report at `value`, without making the
        report where the template serves."""
        template = self._affine_template()
        if template is None or not template.plan_holds(value) or (value, False) in self._reports:
            report = self.report(value)
            return report.model, dict(report.dims), (*self._implied_note, *report.warnings)
        bound, _ = bind_dims(self.free_dims(), self._binding(value), self.options.get("default_dim"))
        return model_name(self.loaded), bound, (*self._implied_note, *self.loaded.warnings, *template.warnings,
                                                *template.size_warnings)

    def _sized_graph(self, template: _Template, value: int) -> ModelGraph:
        shapes: list[tuple[Dim, ...] | None] = []
        sizes: list[int | None] = []
        made: dict[tuple[Affine, int], tuple[tuple[int, ...], int | None]] = {}  # layers repeat their shapes
        for tensor, affine in zip(template.graph.tensors, template.dims, strict=True):
            if affine is None:
                shapes.append(tensor.shape)
                sizes.append(None)
                continue
            key = (affine, tensor.dtype)
            if key not in made:
                shape = tuple(base + slope * value for base, slope in affine)
                count = 1
                for d in shape:
                    count *= max(d, 0)
                made[key] = shape, tensor_bytes(tensor.dtype, count)
            shape, size = made[key]
            shapes.append(shape)
            sizes.append(size)
        return template.graph.with_sizes(shapes, sizes)

    def _fast_report(self, template: _Template, value: int) -> Report:
        """Give the report at `value` by the passes after sizing (analyze.after_sizing) on the template's graph
        sized at `value` (the same sizes inference gives: verified affine at three probes)."""
        return after_sizing(self.sizing(value), self.options.get("order", DEFAULT_ORDER),
                            self.options.get("rules", DEFAULT_INFERENCE_RULES)).report


def _all_ints(shape: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in shape)


def _fit_affine(probed: Sequence[tuple[Dim, ...] | None], probes: Probes) -> Affine | None:
    if any(s is None or not _all_ints(s) for s in probed) or len({len(s) for s in probed if s is not None}) != 1:
        return None
    (p1, p2, p3) = probes
    affine = []
    for d1, d2, d3 in zip(*probed, strict=True):
        slope, remainder = divmod(d2 - d1, p2 - p1)
        base = d1 - slope * p1
        if remainder or base + slope * p3 != d3:
            return None
        affine.append((base, slope))
    return tuple(affine)


def _bytes_poly(affine: Affine, bits: int) -> Poly:
    poly = [bits // 8]
    for base, slope in affine:
        product = [0] * (len(poly) + 1)
        for k, c in enumerate(poly):
            product[k] += c * base
            product[k + 1] += c * slope
        poly = product
    while len(poly) > 1 and poly[-1] == 0:
        poly.pop()
    return tuple(poly)


def _step_polys(timeline: Timeline, polys: Sequence[Poly | None]) -> list[Poly]:
    """Give, per step, the live bytes as a polynomial of the value: the live bytes of each coefficient
    (liveness.live_bytes, the sweep of inference and training)."""
    degree = max((len(p) for p in polys if p is not None), default=1)
    spans = [(poly, first, last) for poly, first, last in zip(polys, timeline.first_step, timeline.last_step,
                                                                strict=True) if first >= 0 and poly is not None]
    columns = [live_bytes([(poly[k], first, last) for poly, first, last in spans if k < len(poly)],
                          len(timeline.order)) for k in range(degree)]  # (a poly of a lower degree: its own)
    return list(zip(*columns, strict=True))


def _frontier(polys: list[Poly]) -> list[Poly]:
    """Give the polynomials no other one dominates coefficient by coefficient (the rest never hold the peak)."""
    frontier: list[Poly] = []
    for poly in sorted(set(polys), reverse=True):
        if not any(all(a >= b for a, b in zip(kept, poly, strict=True)) for kept in frontier):
            frontier.append(poly)
    return frontier


def _evaluate(poly: Poly, value: int) -> int:
    result = 0
    for c in reversed(poly):
        result = result * value + c
    return result

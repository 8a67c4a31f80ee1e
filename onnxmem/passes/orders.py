"""The registry of execution orders: each order's name, what it is, and the pass that makes it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onnxmem.ir.graph import ModelGraph
from onnxmem.passes.order import memory_order
from onnxmem.passes.schedule import model_order, named_order, ort_order, topological_order
from onnxmem.targets.ort.rules import DEFAULT_INFERENCE_RULES, InferenceRules


@dataclass(frozen=True)
class Order:
    """A named execution order."""

    name: str
    make: Callable[[ModelGraph, InferenceRules], list[int]]
    help: str  # what the order is, in words (the CLI's --help)


ORDERS: dict[str, Order] = {o.name: o for o in (
    Order("ort", lambda graph, rules: ort_order(graph),
          "onnxruntime's sequential executor (the default; what `validate` measures): a reverse depth-first walk "
          "from the graph's outputs"),
    Order("model", lambda graph, rules: model_order(graph),
          "the file's own node order (a topological sort where the file's is not one)"),
    Order("memory", memory_order,
          "a greedy least-peak-first order (as PyTorch Inductor's): what a memory-aware scheduler could reach"),
    Order("topological", lambda graph, rules: topological_order(graph),
          "a topological sort, ties broken by position in the file"),
)}
DEFAULT_ORDER = "ort"
SIZE_DEPENDENT_ORDERS = frozenset({"memory"})  # orders that read the tensors' sizes (the others, only the wiring)


def execution_order(graph: ModelGraph, name: str | Sequence[str],
                    rules: InferenceRules = DEFAULT_INFERENCE_RULES) -> list[int]:
    """Give the ops of the graph in the named order (see ORDERS), or in the order given as a list of node names (as
    a runtime's profile lists them). `rules`: the buffer rules a memory-aware order plans with."""
    if not isinstance(name, str):
        return named_order(graph, name)
    if name not in ORDERS:
        raise ValueError(f"unknown order '{name}'; choose from {', '.join(ORDERS)}")
    return ORDERS[name].make(graph, rules)


def orders_help() -> str:
    """Give every order's name and what it is, for --help."""
    return "; ".join(f"{o.name}: {o.help}" for o in ORDERS.values())

"""Per-operator memory rules, kept as tables: adding an operator is one line in one table. The defaults are the
CPU provider's, measured; each provider gives its own (base.ExecutionProvider.buffer_rules)."""

from __future__ import annotations

from dataclasses import dataclass

from onnxmem.targets.ort.cpu.tables import ALIASES, IN_PLACE, IN_PLACE_FROM_INPUT
from onnxmem.targets.ort.tables import TAKES_NO_FREED_BUFFER


@dataclass(frozen=True)
class InferenceRules:
    """Which outputs share an input's buffer (aliases) or may take a dying input's buffer (in place)."""

    aliases: dict[str, int]  # op type -> input index whose buffer output 0 always shares
    in_place: frozenset[str]  # op types whose output 0 may reuse input 0's buffer when input 0 dies there
    reuse_freed: bool = True  # a new output takes a freed buffer of its size, which stays held until then
    no_freed_buffer: frozenset[str] = frozenset()  # op types whose outputs never take a freed buffer
    # op types whose output 0 may reuse another input's buffer than input 0 (that input's slot), as in_place
    in_place_from: tuple[tuple[str, int], ...] = ()

    def alias_input(self, op_type: str, domain: str = "") -> int | None:
        """Give the input whose buffer the op's first output shares, or None."""
        return self.aliases.get(_key(op_type, domain))

    def may_take_freed(self, op_type: str, domain: str = "") -> bool:
        """Say whether the op's outputs may take a buffer that an earlier tensor freed."""
        return self.reuse_freed and _key(op_type, domain) not in self.no_freed_buffer

    def may_run_in_place(self, op_type: str, domain: str = "") -> bool:
        """Say whether the op's first output may take its dying first input's buffer."""
        return _key(op_type, domain) in self.in_place

    def in_place_input(self, op_type: str, domain: str = "") -> int | None:
        """Give the input whose dying buffer the op's first output may take (run in place), or None."""
        key = _key(op_type, domain)
        if key in self.in_place:
            return 0
        return next((slot for name, slot in self.in_place_from if name == key), None)


def _key(op_type: str, domain: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


DEFAULT_INFERENCE_RULES = InferenceRules(dict(ALIASES), frozenset(IN_PLACE), no_freed_buffer=TAKES_NO_FREED_BUFFER,
                                         in_place_from=tuple(IN_PLACE_FROM_INPUT.items()))
NO_REUSE_RULES = InferenceRules({}, frozenset(), reuse_freed=False)

"""PyTorch training on a CUDA GPU: what the step model asks of the device, answered for CUDA.

What differs from CPU in the step today: dropout keeps a bool mask (the generic rule's 8 bits per element),
autocast's fp32 list is CUDA's (tables.py AUTOCAST_FP32), the optimizer update defaults to foreach (temporaries over
all parameters at once), a recurrent op keeps cuDNN's reserve space (tables.py CUDA_RESERVE_VALUES), and the
autograd graph is host memory, not the GPU's (not counted). No library keeps buffers in the step's count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxmem.targets.torch.base import DeviceOption, HeldPeaks, LibraryBuffer, NodeContext, NodeFacts
from onnxmem.targets.torch.cuda.allocator import replay
from onnxmem.targets.torch.cuda.tables import AUTOCAST_FP32, CUDA_RESERVE_VALUES

if TYPE_CHECKING:
    from onnxmem.training.values import StepNode, StepValue

CAVEAT = ("the CUDA device model is not calibrated (no GPU measurement yet): it counts the tensors of the step, "
          "cuDNN's recurrent reserve space and the foreach update; it does not model cuBLAS or cuDNN workspaces, "
          "which scaled_dot_product_attention backend runs (flash, memory-efficient, math) and what each keeps, or "
          "autocast's weight cache beyond one 16-bit copy per weight; held_bytes replays the caching allocator "
          "(memory_reserved) but the report does not use it yet")


@dataclass(frozen=True)
class TorchCuda:
    """PyTorch on one CUDA GPU (takes no options)."""

    name: str = "cuda"
    options: Sequence[DeviceOption] = ()
    default_update_impl: str = "foreach"
    autograd_node_bytes: int = 0  # the autograd graph is host memory: not the GPU's
    caveat: str = CAVEAT

    def check(self) -> None:
        """Raise nothing: the device takes no options."""

    def unmodelled(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                   differentiable: list[bool], precision: str) -> tuple[str, ...]:
        """Give nothing: the whole device is uncalibrated, which its caveat says."""
        return ()

    def autocast_fp32(self, key: str, appended_loss: bool) -> bool:
        """Say whether autocast on CUDA runs the op in fp32 (tables.py AUTOCAST_FP32)."""
        return key in AUTOCAST_FP32

    def node_facts(self, context: NodeContext) -> NodeFacts:
        """Give cuDNN's reserve space for a recurrent op (tables.py CUDA_RESERVE_VALUES); nothing for other ops."""
        values = CUDA_RESERVE_VALUES.get(context.recurrent, 0) if context.recurrent else 0
        if not values or context.recurrent_dims is None:
            return NodeFacts()
        steps, directions, batch, _, hidden = context.recurrent_dims
        return NodeFacts(kept_bytes=4 * directions * steps * batch * hidden * values)

    def library_uses(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                     differentiable: list[bool], precision: str) -> object:
        """Give nothing: no CUDA library's buffers are counted with the step."""
        return None

    def library_buffers(self, uses: object, event: Callable[[int, bool], int]) -> list[LibraryBuffer]:
        """Give no buffers (library_uses gives none)."""
        return []

    def held_bytes(self, events: Sequence[tuple[int, bool]]) -> HeldPeaks:
        """Give PyTorch's CUDA caching allocator's peaks over the events (allocator.py replay): memory_allocated
        and memory_reserved. Uncalibrated (see CAVEAT)."""
        peaks = replay(events)
        return HeldPeaks(peaks.allocated, peaks.reserved)

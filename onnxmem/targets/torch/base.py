"""The interface of a device PyTorch trains on: `DeviceModel`, what the device-neutral step model
(onnxmem/training/) asks a device, and the options a device declares.

The step model computes what is true on every device (the tensors an op keeps for backward, gradients, optimizer
states, the schedule of one step); a device adds what its kernels and libraries do: which kernel an op takes and
what that kernel keeps or allocates besides (a convolution's scratch, a recurrent op's workspace or reserve space,
a dropout mask's dtype, the math attention's fp32 copies), the buffers its libraries keep for the process's life
(MKL's GEMM pools, oneDNN's cached primitives), the host heap of the autograd graph where that is the memory asked
about, which ops autocast runs in fp32, the optimizer update PyTorch picks there, and the allocator that turns the
live bytes of the step into the bytes the process holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from onnxmem.errors import TrainingOptionError

if TYPE_CHECKING:
    from onnxmem.ir.graph import ModelGraph
    from onnxmem.training.values import RecurrentDims, StepNode, StepValue


@dataclass(frozen=True)
class DeviceOption:
    """An option a device takes (the CLI's --device-option NAME=VALUE, a field of the device's dataclass)."""

    name: str  # the field of the device's dataclass
    kind: type  # int or str: what a command-line value is read as
    help: str
    choices: Callable[[], Sequence[str]] | None = None  # the values a str option takes, read when asked
    minimum: int | None = None  # the least value an int option takes


@dataclass(frozen=True)
class NodeContext:
    """What a device reads about one differentiable op of the step: the op, the step's values, what needs a
    gradient, the training precision, and (a recurrent op) its kind and dims."""

    graph: ModelGraph
    index: int  # the node's position in `nodes`
    node: StepNode
    values: list[StepValue]
    needs_grad: list[bool]
    precision: str
    key: str  # the op's key in the rule tables (training/values.py rule_key)
    recurrent: str = ""  # a recurrent op's kind (Saves.recurrent), "" for other ops
    recurrent_dims: RecurrentDims | None = None


@dataclass(frozen=True)
class NodeFacts:
    """What a device adds to one differentiable op besides the tensors the generic rule keeps, in bytes."""

    kept_bytes: int = 0  # kept from forward to backward besides tensors (a workspace, a reserve, a copy)
    backward_temporaries: int = 0  # held a moment while its backward runs
    forward_temporaries: int = 0  # held a moment while its forward runs
    autograd_nodes: int | None = None  # the autograd nodes PyTorch makes for it where not one
    mask_like_output: bool = False  # its extra (dropout's mask) has output 0's dtype, not the rule's bits
    math_in_fp32: bool = False  # its copies and [q_len, kv_len] tensors are fp32 from 16-bit inputs


@dataclass(frozen=True)
class LibraryBuffer:
    """A buffer a device library keeps from the event that makes it to the process's end."""

    name: str
    category: str  # the category the report lists it under
    nbytes: int
    event: int  # the event of the step that makes it


@dataclass(frozen=True)
class HeldPeaks:
    """The peaks of an allocator over a sequence of events: the bytes handed out (memory_allocated) and the bytes
    held from the device (memory_reserved)."""

    allocated: int
    reserved: int


class DeviceModel(Protocol):
    """What the step model asks of the device PyTorch trains on (implementations: frozen dataclasses, one per
    device, registered in onnxmem.targets.torch.DEVICES)."""

    @property
    def name(self) -> str:
        """The device's key in DEVICES."""
        ...

    @property
    def options(self) -> Sequence[DeviceOption]:
        """The options it takes (fields of its dataclass)."""
        ...

    @property
    def default_update_impl(self) -> str:
        """The optimizer update PyTorch picks there: "foreach" | "for-loop"."""
        ...

    @property
    def autograd_node_bytes(self) -> int:
        """The heap per autograd node counted with the step (0 where it is not the memory asked about)."""
        ...

    @property
    def clone_makes_storage(self) -> bool:
        """Whether an exported aten.clone (an Identity: `.contiguous()` of a transposed attention output,
        `.clone()`) is counted as a second storage there, or as a view of its input."""
        ...

    @property
    def promotes_by_copy(self) -> bool:
        """Whether an elementwise op over inputs of different float widths first copies each narrower input to the
        promoted dtype (CPU's TensorIterator) rather than casting as it reads (CUDA's dynamic casting)."""
        ...

    @property
    def caveat(self) -> str:
        """What the model does not cover, for the report's reader."""
        ...

    def check(self) -> None:
        """Raise TrainingOptionError where an option's value is not one the device takes."""
        ...

    def autocast_fp32(self, key: str, appended_loss: bool) -> bool:
        """Say whether autocast runs the op of this rule key (or a loss op onnxmem appends) in fp32."""
        ...

    def kernel_key(self, context: NodeContext) -> str:
        """Give the rule key (training/rules.py) of the kernel the device runs for this op: context.key where the
        device has one kernel for it, a variant where the device picks among several (CUDA's attention backends)."""
        ...

    def node_facts(self, context: NodeContext) -> NodeFacts:
        """Give what the device's kernel for this differentiable op keeps and allocates besides its tensors
        (context.key is the kernel's key, from kernel_key)."""
        ...

    def library_uses(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                     differentiable: list[bool], precision: str) -> object:
        """Give what the step's ops ask of the device's libraries (read back by library_buffers only)."""
        ...

    def library_buffers(self, uses: object, event: Callable[[int, bool], int]) -> list[LibraryBuffer]:
        """Give the buffers the libraries keep for `uses`, made at event(node, in its backward) (< 0: not run)."""
        ...

    def unmodelled(self, nodes: list[StepNode], values: list[StepValue], needs_grad: list[bool],
                   differentiable: list[bool], precision: str) -> tuple[str, ...]:
        """Give '[unmodelled-kernel] message' notes for kernels the step runs whose memory the device model knows
        it does not count (the estimate may be low there), empty where none."""
        ...

    def held_bytes(self, events: Sequence[tuple[int, bool]]) -> HeldPeaks:
        """Give the allocator's peaks over (size, is a free) events: a free names the size it frees, the most recent
        live allocation of that size."""
        ...


def configured(device: DeviceModel, values: Mapping[str, object]) -> DeviceModel:
    """Give the device with the options in `values` (names of its declared options; command-line strings are read
    as the option's type), checked; a name the device does not declare is a TrainingOptionError that names the
    options it takes."""
    declared = {option.name: option for option in device.options}
    changes: dict[str, object] = {}
    for name, value in values.items():
        option = declared.get(name)
        if option is None:
            takes = ", ".join(declared) or "none"
            raise TrainingOptionError(f"device '{device.name}' takes no option '{name}' (its options: {takes})")
        if option.kind is int and isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise TrainingOptionError(f"device option {name}={value!r}: expected a whole number") from None
        changes[name] = value
    made: DeviceModel = dataclasses.replace(device, **changes)  # type: ignore[type-var]
    made.check()
    return made

"""PyTorch training devices, one `DeviceModel` each (base.py), registered by name in DEVICES: cuda/ and cpu/ hold
each device's code and rule tables."""

from __future__ import annotations

from collections.abc import Mapping

from onnxmem.errors import TrainingOptionError
from onnxmem.targets.torch.base import DeviceModel, DeviceOption, configured
from onnxmem.targets.torch.cpu import TorchCpu
from onnxmem.targets.torch.cuda import TorchCuda

# Each device with its default options, by the name TrainingOptions and --device take.
DEVICES: dict[str, DeviceModel] = {"cuda": TorchCuda(), "cpu": TorchCpu()}


def device_named(name: str, options: Mapping[str, object] | None = None) -> DeviceModel:
    """Give the device of this name (a key of DEVICES) with `options` (its declared options), checked."""
    device = DEVICES.get(name)
    if device is None:
        raise TrainingOptionError(f"unknown device '{name}': choose one of {', '.join(DEVICES)}")
    return configured(device, options) if options else device


__all__ = ["DEVICES", "DeviceModel", "DeviceOption", "TorchCpu", "TorchCuda", "device_named"]

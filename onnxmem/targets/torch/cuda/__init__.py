"""PyTorch training on a CUDA GPU: the device model (device.py), its tables (tables.py) and a replay of PyTorch's
CUDA caching allocator (allocator.py)."""

from onnxmem.targets.torch.cuda.device import TorchCuda

__all__ = ["TorchCuda"]

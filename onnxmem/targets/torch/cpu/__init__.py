"""PyTorch training on CPU: the device model (device.py), its tables (tables.py), a convolution's kernels
(convolution.py), oneDNN's primitives (primitives.py), MKL's GEMMs (gemm.py) and the instruction set (isa.py)."""

from onnxmem.targets.torch.cpu.device import TorchCpu

__all__ = ["TorchCpu"]

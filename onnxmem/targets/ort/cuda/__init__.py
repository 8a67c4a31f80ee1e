"""onnxruntime's CUDA execution provider: its class (provider.py), its kernels' tables (tables.py, from onnxruntime's
source: not yet measured on a GPU) and its placement of nodes between device and host with the copies between them
(placement.py)."""

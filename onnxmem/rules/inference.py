"""Inference buffer rules, mirroring what onnxruntime's CPU kernels declare to its memory planner.

ALIASES: the kernel's output 0 is a view of input N (KernelDefBuilder::Alias(N, 0)); it allocates nothing.
IN_PLACE: the kernel may write output 0 into input 0's buffer (KernelDefBuilder::MayInplace(0, 0)); the
planner does so when input 0 dies at this node and has the output's exact size.
Operators of other domains are keyed 'domain::OpType'.
"""

from __future__ import annotations

ALIASES: dict[str, int] = {
    "Reshape": 0,
    "Squeeze": 0,
    "Unsqueeze": 0,
    "Flatten": 0,
    "Identity": 0,
    "com.microsoft::ExpandDims": 0,
}

IN_PLACE: set[str] = {
    "Relu",
    "Sigmoid",
}

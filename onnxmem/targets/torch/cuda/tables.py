"""PyTorch on CUDA as data: which ops autocast runs in fp32, what cuDNN's recurrent kernels reserve.

Keyed as training/rules.py's SAVED_FOR_BACKWARD (ONNX op types, 'domain::OpType', 'aten::<op>'). Not measured on a
GPU here: autocast's list is read from PyTorch's (aten/src/ATen/autocast_mode.cpp, CUDA's fp32 ops), the reserve
space from cuDNN's LSTM.
"""

from __future__ import annotations

# torch.autocast on CUDA runs these in fp32 (their 16-bit inputs are cast up); the rest follow their inputs, and
# training/rules.py AUTOCAST_LOW_PRECISION run in 16 bits
AUTOCAST_FP32: frozenset[str] = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "Exp", "Log", "Pow", "ReduceSum",
    "ReduceProd", "CumSum", "Reciprocal", "Softplus", "NegativeLogLikelihoodLoss", "MeanSquaredError",
    "aten::log_softmax", "aten::_log_softmax", "aten::softmax", "aten::_softmax", "aten::layer_norm",
    "aten::native_layer_norm", "aten::group_norm", "aten::native_group_norm", "aten::softplus", "aten::rms_norm",
})

# cuDNN's reserve space for a recurrent op (by Saves.recurrent), kept from forward to backward: about this many fp32
# values per step, direction, batch row and hidden unit (LSTM: its 4 gates, the cell and hidden states per step;
# GRU's is not measured: taken as LSTM's)
CUDA_RESERVE_VALUES: dict[str, int] = {"LSTM": 6, "GRU": 6}

# ops that run in cuDNN's convolutions, whose workspaces the device model does not count (device.py unmodelled)
CUDNN_CONVOLUTIONS: frozenset[str] = frozenset({"Conv", "ConvTranspose", "aten::convolution", "aten::conv2d"})

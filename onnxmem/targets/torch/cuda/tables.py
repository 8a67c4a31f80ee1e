"""PyTorch on CUDA as data: which ops autocast runs in fp32, what cuDNN's recurrent kernels reserve, which ops run in
cuDNN's convolutions, which loss ops run at their input's width.

Keyed as training/rules.py's SAVED_FOR_BACKWARD (ONNX op types, 'domain::OpType', 'aten::<op>'). Autocast's list is
read from PyTorch's (aten/src/ATen/autocast_mode.cpp, CUDA's fp32 ops), the reserve space from cuDNN's LSTM (neither
measured on a GPU yet); LOSS_AT_INPUT_WIDTH rests on the H100 rows (its comment).
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

# ops that run in cuDNN's convolutions: convolution.py counts the 2-D ones the H100 rows cover; device.py unmodelled
# names the rest
CUDNN_CONVOLUTIONS: frozenset[str] = frozenset({"Conv", "ConvTranspose", "aten::convolution", "aten::conv2d"})

# the loss's ops (the ones onnxmem appends) that autocast on CUDA runs at their input's width: F.cross_entropy calls
# log_softmax(x, dim, x.scalar_type()), and an explicit dtype passes autocast's fp32_set_opt_dtype policy untouched,
# so the log-probabilities are 16-bit; nll_loss (fp32 policy) then keeps an fp32 copy of them. The H100 rows of gpt2
# and llama_gqa under autocast: the loss phase keeps 94.5 MiB for [2048, 8000] logits (31.25 MiB at 2 bytes + 62.5
# MiB at 4), where an fp32 log_softmax would keep 62.5
LOSS_AT_INPUT_WIDTH: frozenset[str] = frozenset({"LogSoftmax"})

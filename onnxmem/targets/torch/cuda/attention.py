"""Which kernel F.scaled_dot_product_attention takes on a CUDA GPU, and so what it keeps for backward.

PyTorch picks the first backend of its priority order whose constraints the call meets
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, select_sdp_backend). On sm90/sm100 with cuDNN newer than
9.15 (PyTorch 2.11's CUDA 13 wheels ship cuDNN 9.19, the H100 rows' `cudnn: 91900`) the order is cuDNN attention,
flash, memory-efficient, math. The fused kernels (cuDNN, flash, memory-efficient) keep q, k, v, the output and one
fp32 log-sum-exp per query row (training/rules.py "scaled_dot_product_attention"); the math path keeps q * scale,
k^T * scale, v and the [..., q_len, kv_len] probabilities, with dropout also the bool mask and the dropped
probabilities (rules.py "scaled_dot_product_attention(math...)").

The constraints modelled, from sdp_utils.cpp (the ones an export can show):
- cuDNN: 16-bit inputs; head dims multiples of 8 and at most 128 for a backward (or 192/128, 256/256); a key length
  other than 1; grouped-query key/values allowed; dropout allowed: the H100 rows singleop/sdpa-variants/
  {bf16,fp16}-b8-q*-d*-dropout and -causal-dropout (dropout_p 0.1) took cuDNN by default (its backward node
  ScaledDotProductCudnnAttentionBackward0), where this model said flash before.
- flash: 16-bit inputs; no attention mask tensor; q, k and v of one head dim, at most 256; causal only with
  q_len == kv_len (not visible: causal calls are taken as square); grouped-query key/values allowed.
- memory-efficient: fp32 or 16-bit; q and k of one head dim; head dims multiples of 4 (fp32) or 8 (16-bit);
  masks and dropout allowed; NOT grouped-query key/values in PyTorch 2.11: the H100 row
  training/llama_gqa/full/*/fp32 (8 query heads, 2 key/value heads, fp32) measured 77.5 MiB more in forward than
  the fused rule, the math path's probabilities (4 layers x 16 MiB) and its repeated k and v.
- math: everything else.
The rows the choice was checked on: bert and gpt2 (dropout 0.1: memory-efficient in fp32, flash under autocast;
the CPU's math rule overcounted them by 38-54%), llama_gqa (cuDNN under autocast, math in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

FUSED = "aten::scaled_dot_product_attention"
WITH_DROPOUT = "aten::scaled_dot_product_attention(dropout)"  # what the export marks (training/export.py)

# the math path's rule keys (training/rules.py ATEN_SAVED_FOR_BACKWARD), by (dropout, grouped-query)
MATH_RULES: dict[tuple[bool, bool], str] = {
    (False, False): "aten::scaled_dot_product_attention(math)",
    (True, False): "aten::scaled_dot_product_attention(math-dropout)",
    (False, True): "aten::scaled_dot_product_attention(math-gqa)",
    (True, True): "aten::scaled_dot_product_attention(math-dropout-gqa)",
}


# a head repeat as transformers' repeat_kv exports it (x[:, :, None].expand(...).reshape(...)), walked back from k
REPEAT_OPS: frozenset[str] = frozenset({"Reshape", "Expand", "Unsqueeze", "Identity", "Slice"})
REPEAT_WALK = 6


@dataclass(frozen=True)
class AttentionCall:
    """What an export shows of one scaled_dot_product_attention call, as the backend choice reads it."""

    element_bytes: int  # of q, k and v as the kernel gets them (2 under autocast)
    q_heads: int | None
    kv_heads: int | None
    q_head_dim: int | None
    k_head_dim: int | None
    v_head_dim: int | None
    kv_len: int | None
    mask: bool  # an attention mask tensor is passed
    dropout: bool


def backend(call: AttentionCall) -> str:
    """Give the backend PyTorch 2.11 picks on an sm90 GPU: "cudnn" | "flash" | "efficient" | "math"."""
    low = call.element_bytes == 2
    dims = (call.q_head_dim, call.k_head_dim, call.v_head_dim)
    known = all(isinstance(d, int) and d > 0 for d in dims)
    same_dim = known and call.q_head_dim == call.k_head_dim == call.v_head_dim
    grouped = call.q_heads is not None and call.kv_heads is not None and call.q_heads != call.kv_heads
    if low and known and _cudnn_head_dims(call) and call.kv_len != 1:
        return "cudnn"
    if low and not call.mask and same_dim and (call.q_head_dim or 0) <= 256:
        return "flash"
    alignment = 8 if low else 4
    if known and call.q_head_dim == call.k_head_dim and not grouped \
            and all((d or 0) % alignment == 0 for d in (call.q_head_dim, call.v_head_dim)):
        return "efficient"
    return "math"


def _cudnn_head_dims(call: AttentionCall) -> bool:
    qk, v = call.q_head_dim or 0, call.v_head_dim or 0
    if qk % 8 or v % 8:
        return False
    return (qk <= 128 and v <= 128) or (qk, v) in ((192, 128), (256, 256))


def rule_key(call: AttentionCall) -> str:
    """Give the rule key of what the chosen backend keeps for backward."""
    chosen = backend(call)
    if chosen != "math":
        return FUSED
    grouped = call.q_heads is not None and call.kv_heads is not None and call.q_heads != call.kv_heads
    return MATH_RULES[(call.dropout, grouped)]


# What each fused backend's backward holds a moment besides the gradients of q, k and v, from the H100 rows
# singleop/sdpa/* and singleop/sdpa-variants/* (each backend run alone; `bwd peak` minus the gradients): with O the
# output's bytes and R the fp32 row statistics (one per query row, as the log-sum-exp the forward keeps),
# - cuDNN: 2 O + R, every head dim and dtype (e.g. bf16-b8-q2048-d64-plain: 32.5 MiB = 2 x 16 + 0.5);
# - flash: 2 O + R + its fp32 dq accumulator at the head dim rounded up to 32 (4 O + R at d64/128/256:
#   bf16-b8-q2048-d64-plain 64.5 MiB; bf16-b8-q2048-d80-plain 88.5 MiB = 2 x 20 + 0.5 + 48 (d 96 in fp32));
# - memory-efficient: 2 O + R in 16 bits, O + 2 R in fp32, at head dims that are multiples of 32 (fp32-b8-q2048-
#   d64-plain: 33 MiB = 32 + 2 x 0.5); head dim 80 measured more (3.2 O, 1.6 O) and 256 in 16 bits 2.4-6 O:
#   taken as the rule;
# - grouped-query key/values (enable_gqa, -gqa rows): cuDNN and flash add 2 O (k's and v's gradients at the
#   query's heads, summed into the key/value heads after): cudnn 4 O + R, flash 6 O + R.
# Causal, masks and dropout change none of these (the -causal, -mask-*, -dropout rows).
FLASH_HEAD_DIM_ROUND = 32


def backward_scratch(call: AttentionCall, output_bytes: int, query_numel: int, chosen: str | None = None) -> int:
    """Give the bytes the fused backend's backward holds besides q's, k's and v's gradients: the one PyTorch picks
    for the call, or `chosen` (0 for math: its backward is the generic ops')."""
    chosen = chosen or backend(call)
    head_dim = call.q_head_dim or 0
    if chosen == "math" or head_dim <= 0 or output_bytes <= 0:
        return 0
    rows = 4 * (query_numel // head_dim)  # fp32 row statistics
    grouped = call.q_heads is not None and call.kv_heads is not None and call.q_heads != call.kv_heads
    expanded = 2 * output_bytes if grouped else 0
    if chosen == "cudnn":
        return 2 * output_bytes + rows + expanded
    if chosen == "flash":
        rounded = -(-head_dim // FLASH_HEAD_DIM_ROUND) * FLASH_HEAD_DIM_ROUND
        accumulator = (query_numel // head_dim) * rounded * 4
        return 2 * output_bytes + rows + accumulator + expanded
    if call.element_bytes >= 4:
        return output_bytes + 2 * rows
    return 2 * output_bytes + rows

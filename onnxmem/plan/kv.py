"""The KV cache in plans: what-ifs for a smaller cache (int8, fp8, grouped-query heads) and how it grows with the
searched dim.

The shared-buffer what-if is the step as onnxruntime-genai runs a model builder's decoder (past_present_share_buffer,
genai_config.json beside the model): past and present one buffer of max_length positions, updated in place.

Each what-if is the same Sizing with the cache tensors re-sized (shapes.kvcache.resized_cache: the past inputs and
present outputs at their new bytes, every other tensor as it is), analysed again by the passes after sizing: the
peak it gives is the report's, not a formula on the cache's total.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from onnxmem.ir.dtypes import element_bits
from onnxmem.passes.pipeline import Sizing
from onnxmem.plan.family import ModelFamily
from onnxmem.shapes.kvcache import (
    FP8_SCALE_BYTES,
    SCALE_BYTES,
    cache_tensors,
    fewer_heads,
    fp8_bytes,
    genai_config,
    int8_bytes,
    kv_cache_of,
    kv_heads,
    resized_cache,
    shared_buffer_size,
)
from onnxmem.views.report import KVCache

MAX_GROUP = 8  # grouped-query: at most this many query heads share one KV head (Llama-2-70B's and Llama-3's 8)


def kv_what_ifs(at: Sizing) -> list[tuple[str, Sizing, str]]:
    """Give (change, the Sizing with its cache re-sized, detail) for each smaller KV cache that applies to the
    model at `at`: int8 and fp8 where its elements take more than a byte, fewer KV heads where it has one per
    query head (MHA); none where it has no KV cache."""
    graph = at.graph
    found = cache_tensors(graph)
    if found is None:
        return []
    changes: list[tuple[str, Sizing, str]] = []
    bits = {element_bits(graph.tensors[t].dtype) or 0 for t in (*found.past, *found.present)}
    if min(bits) > 8:
        for change, size, detail in (
                ("KV cache in int8", int8_bytes,
                 f"the past inputs and present outputs at 1 byte per element plus a float16 scale ({SCALE_BYTES} B) "
                 "per token and KV head (symmetric per-token int8, one scale per head_dim row); the attention's own "
                 "temporaries unchanged"),
                ("KV cache in fp8", fp8_bytes,
                 f"the past inputs and present outputs at 1 byte per element (e4m3) plus one float32 scale "
                 f"({FP8_SCALE_BYTES} B) per cache tensor; the attention's own temporaries unchanged")):
            resized = resized_cache(graph, found, size)
            if resized is not None:
                changes.append((change, dataclasses.replace(at, graph=resized), detail))
    length = shared_buffer_length(at.loaded.path)
    shared = shared_buffer_size(found, graph, length) if length is not None else None
    resized_shared = resized_cache(graph, found, shared) if shared is not None else None
    if resized_shared is not None:
        changes.append((f"KV cache in one buffer of {length} positions (onnxruntime-genai)",
                        dataclasses.replace(at, graph=resized_shared),
                        "past and present share one buffer of max_length positions per cache tensor, which "
                        "GroupQueryAttention updates in place (genai_config.json: past_present_share_buffer): the "
                        "past inputs at max_length, no present allocated"))
    heads = kv_heads(found, graph)
    if not found.shared and heads is not None and heads > 1:
        group = max(g for g in range(1, MAX_GROUP + 1) if heads % g == 0)
        fewer = fewer_heads(found, graph, group) if group > 1 else None
        resized = resized_cache(graph, found, fewer) if fewer is not None else None
        if resized is not None:
            changes.append((f"grouped-query KV heads {heads} -> {heads // group}",
                            dataclasses.replace(at, graph=resized),
                            f"{group} query heads share each KV head (the model has one KV head per query head): the "
                            "cache tensors re-sized, the K and V projections as they are"))
    return changes


def shared_buffer_length(model_path: Path | None) -> int | None:
    """Give the length of the shared past/present buffer onnxruntime-genai runs the model with: search.max_length
    (else model.context_length) of the genai_config.json beside the model, where it says past_present_share_buffer
    (its default: true); None where there is no such file or it says otherwise."""
    config = genai_config(model_path)
    if config is None:
        return None
    search = config.get("search")
    search = search if isinstance(search, dict) else {}
    model = config.get("model")
    if search.get("past_present_share_buffer", True) is not True:
        return None
    length = search.get("max_length") or (model.get("context_length") if isinstance(model, dict) else None)
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None


def kv_growth_note(search: str, value: int, step: int, family: ModelFamily) -> str | None:
    """Give the fit note on the KV cache at the answer `value` and what each `step` of the searched dim adds to it
    (the cache at value and at value + step), or None where the model has no KV cache."""
    here, after = _cache_at(family, value), _cache_at(family, value + step)
    if here is None:
        return None
    grows = (after.bytes - here.bytes) if after is not None else 0
    per = f"{step} {search}" if step > 1 else f"unit of {search}"
    return (f"KV cache at {search}={value}: {here.bytes:,} B (past inputs {here.past_bytes:,} B + present outputs "
            f"{here.present_bytes:,} B); each {per} adds {grows:,} B to it")


def _cache_at(family: ModelFamily, value: int) -> KVCache | None:
    # an affine family's Sizing is made from its template with no inference; another's report is the one its search
    # already made at that value
    return kv_cache_of(family.sizing(value).graph) if family.affine else family.report(value).inference.kv_cache

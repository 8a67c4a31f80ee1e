"""Training zoo: onnxmem's training-step estimate on architectures the project never used, against PyTorch.

    python benchmarks/training_zoo.py [--models a,b] [--half dev|held-out|all] [--out DIR] [--no-variants]

Sixteen architectures in none of benchmarks/zoo.py, zoo2.py, zoo3.py, accuracy_training.py, benchmarks/cuda/ or
fixtures/ (small configs, random weights, torch.manual_seed(0), nothing downloaded: HF_HUB_OFFLINE=1), split once
and for all into two halves (HALVES below):

- development (rules may be written from these rows): hand_gpt (a GPT-like written in torch: fused qkv Linear
  split three ways, F.scaled_dot_product_attention with dropout, tied head), hand_llama (a Llama-like in torch:
  RMSNorm and rotary written out, GQA by repeat_interleave, SwiGLU), hand_lstm (an LSTM classifier over token ids),
  timm convnextv2_atto (GRN), timm efficientvit_b0 (ReLU linear attention), transformers Falcon (multi-query,
  parallel attention, tied head), Phi-3 (fused qkv_proj and gate_up_proj), Qwen2-MoE (4 experts, top-2, a shared
  expert; experts_implementation "batched_mm").
- held out (never write a rule from these rows): timm pvt_v2_b0, inception_next_atto (11-wide band depthwise
  kernels), dla46_c; transformers GPTBigCode (multi-query, fused c_attn), StableLM, MobileBERT, Data2Vec-Audio
  (a convolutional feature encoder over raw audio), GPT-J.

Each model is exported twice: the way a user does by default (torch.onnx.export(model.eval(), example,
dynamo=True), static shapes at the small batch) and the way onnxmem recommends (onnxmem.torch.export_for_training,
a symbolic batch). Exports are kept in DIR (default ~/.cache/onnxmem-training-zoo) and not redone.

Rows: fp32 at two batch sizes with sgd and adamw (the recommended export; the default export's estimate beside, at
the small batch, against the same truth); at the small batch, sgd and adamw, every variant the CLI offers that
PyTorch runs on CPU (VARIANTS): amp-bf16, amp-fp16 (torch.autocast('cpu', float16)), a frozen backbone (only the
head trains: --train HEAD), a train subset (the last block and the head: --train), gradient accumulation over two
micro-batches (--grad-accum 2), activation checkpointing per block in fp32 and amp-bf16 (--checkpoint layers:
transformers' gradient_checkpointing_enable(), timm's set_grad_checkpointing(), torch.utils.checkpoint around each
hand-written block; all non-reentrant; not where the model has none: NOT_CHECKPOINTED). Not measured: the
--checkpoint K what-if (onnxmem cuts K segments where few bytes cross; no placement a user writes is that plan).
--variants picks variants to measure (rows of other variants are then not made).

Truth: the first training step's heap peak above what was live before it (every malloc, the LD_PRELOAD counter of
benchmarks/accuracy_training.py, which this script reuses by import: warm_up, check_measurement, heap_peak,
under_malloc_counter), one thread, each row in a process that has made no step before: a fork server imports
torch, torchvision, timm and transformers once and forks one child per row, which then does what accuracy_training's
fresh process does (warm_up, the step, check_measurement). A fork of a process that imported but never computed
holds no oneDNN primitive or MKL buffer, as a fresh process does, without 8 s of imports per row. Beside it,
PyTorch's MemTracker (torch.distributed._tools.mem_tracker) on the same step in this process: its peak less the
parameters, buffers and inputs. error = (estimate - truth) / truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from benchmarks.accuracy_training import (  # noqa: E402
    OPTIMIZERS,
    TOOLS,
    LogitsOnly,
    _classes,
    _tokens,
    check_measurement,
    heap_peak,
    under_malloc_counter,
    variant_step,
    warm_up,
)
from benchmarks.zoo import quiet  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# Hand-written models


def _checkpoint(block: nn.Module, *args: torch.Tensor) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    return checkpoint(block, *args, use_reentrant=False)  # type: ignore[no-any-return]


class HandGPTBlock(nn.Module):
    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.p, self.drop = heads, p, nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class HandGPT(nn.Module):
    """A GPT-like decoder written in torch: learned positions, fused qkv, SDPA with dropout, head tied to wte."""

    def __init__(self, vocab: int = 1000, d: int = 128, layers: int = 2, heads: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList([HandGPTBlock(d, heads, 0.1) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.checkpointing = False  # torch.utils.checkpoint around each block (use_reentrant=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(positions))
        for block in self.blocks:
            x = _checkpoint(block, x) if self.checkpointing else block(x)
        return self.head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class HandLlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.head_dim, self.heads, self.kv_heads = d // heads, heads, kv_heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class HandLlama(nn.Module):
    """A Llama-like decoder written in torch: RMSNorm and rotary written out, GQA, SwiGLU, an untied head."""

    def __init__(self, vocab: int = 1000, d: int = 128, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 hidden: int = 352, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([HandLlamaBlock(d, heads, kv_heads, hidden) for _ in range(layers)])
        self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab, bias=False)
        head_dim = d // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.checkpointing = False  # torch.utils.checkpoint around each block (use_reentrant=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed(ids)
        for block in self.blocks:
            x = _checkpoint(block, x, cos, sin) if self.checkpointing else block(x, cos, sin)
        return self.head(self.norm(x))


class HandLSTM(nn.Module):
    """An LSTM classifier: token embedding, a two-layer LSTM (dropout between layers), the mean over time."""

    def __init__(self, vocab: int = 1000, d: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(ids))[0].mean(dim=1))


# ---------------------------------------------------------------------------------------------------------------
# Library models


def _timm(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    return build


SMALL = {"vocab_size": 1000, "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
         "max_position_embeddings": 64}


def _hf(model: str, config: str, **values: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers as tf

        settings = dict(values)
        experts = settings.pop("experts_implementation", None)
        made = getattr(tf, model)(getattr(tf, config)(**settings))
        if experts is not None:
            made.set_experts_implementation(experts)
        return LogitsOnly(made)
    return build


class AudioLogits(nn.Module):
    """An audio classifier that returns its logits only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.model(input_values=audio).logits


def _data2vec_audio() -> nn.Module:
    import transformers as tf

    return AudioLogits(tf.Data2VecAudioForSequenceClassification(tf.Data2VecAudioConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=4,
        conv_pos_kernel_size=4, num_labels=10, vocab_size=32, mask_time_prob=0.0, layerdrop=0.0)))


def _images(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(b, 3, 64, 64, generator=torch.Generator().manual_seed(b)),)


def _ids(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 1000, (b, 32), generator=torch.Generator().manual_seed(b)),)


def _audio(b: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(b, 4000, generator=torch.Generator().manual_seed(b)),)


@dataclass
class ZooCase:
    """An architecture: build it (seeded), its inputs at a batch, its loss, and its trainable subsets."""

    name: str
    half: str  # "dev" or "held-out"
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    loss: Callable[[Any, int], torch.Tensor]
    head: tuple[str, ...]  # fnmatch patterns of the head's parameter names (frozen backbone)
    subset: tuple[str, ...]  # the last block and the head (train subset)
    batches: tuple[int, int] = (4, 8)
    # what the model checkpoints when its library's checkpointing is on, as --checkpoint says it: "layers" (onnxmem
    # finds the blocks), or "layers:LEVEL" where the library checkpoints another level than the one found
    checkpointed: str = "layers"


CASES = [
    # development half
    ZooCase("hand_gpt", "dev", HandGPT, _ids, _tokens, ("ln_f.*",), ("blocks.1.*", "ln_f.*")),
    ZooCase("hand_llama", "dev", HandLlama, _ids, _tokens, ("head.*",), ("blocks.1.*", "norm.*", "head.*")),
    ZooCase("hand_lstm", "dev", HandLSTM, _ids, _classes, ("head.*",), ("lstm.*l1*", "head.*")),
    ZooCase("convnextv2_atto", "dev", _timm("convnextv2_atto"), _images, _classes, ("head.*",),
            ("stages.3.*", "head.*")),
    ZooCase("efficientvit_b0", "dev", _timm("efficientvit_b0"), _images, _classes, ("head.*",),
            ("stages.3.*", "head.*"), checkpointed="layers:stages"),  # timm checkpoints its stages whole
    ZooCase("falcon_small", "dev", _hf("FalconForCausalLM", "FalconConfig", **SMALL), _ids, _tokens,
            ("model.transformer.ln_f.*",),  # its head is tied to the embedding
            ("model.transformer.h.1.*", "model.transformer.ln_f.*", "model.lm_head.*")),
    ZooCase("phi3_small", "dev", _hf("Phi3ForCausalLM", "Phi3Config", intermediate_size=256, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, **SMALL), _ids, _tokens,
            ("model.lm_head.*",), ("model.model.layers.1.*", "model.model.norm.*", "model.lm_head.*")),
    ZooCase("qwen2_moe_small", "dev", _hf("Qwen2MoeForCausalLM", "Qwen2MoeConfig", intermediate_size=256,
                                          moe_intermediate_size=64, shared_expert_intermediate_size=128,
                                          num_experts=4, num_experts_per_tok=2, num_key_value_heads=2,
                                          experts_implementation="batched_mm", **SMALL), _ids, _tokens,
            ("model.lm_head.*",), ("model.model.layers.1.*", "model.model.norm.*", "model.lm_head.*")),
    # held-out half
    ZooCase("pvt_v2_b0", "held-out", _timm("pvt_v2_b0"), _images, _classes, ("head.*",), ("stages.3.*", "head.*")),
    ZooCase("inception_next_atto", "held-out", _timm("inception_next_atto"), _images, _classes, ("head.*",),
            ("stages.3.*", "head.*")),
    ZooCase("dla46_c", "held-out", _timm("dla46_c"), _images, _classes, ("fc.*",), ("level5.*", "fc.*")),
    ZooCase("gpt_bigcode_small", "held-out", _hf("GPTBigCodeForCausalLM", "GPTBigCodeConfig", vocab_size=1000,
                                                 n_layer=2, n_embd=128, n_head=4, n_positions=64), _ids, _tokens,
            ("model.transformer.ln_f.*",),  # its head is tied to the embedding
            ("model.transformer.h.1.*", "model.transformer.ln_f.*", "model.lm_head.*")),
    ZooCase("stablelm_small", "held-out", _hf("StableLmForCausalLM", "StableLmConfig", intermediate_size=352,
                                              num_key_value_heads=4, **SMALL), _ids, _tokens,
            ("model.lm_head.*",), ("model.model.layers.1.*", "model.model.norm.*", "model.lm_head.*")),
    ZooCase("mobilebert_small", "held-out", _hf("MobileBertForSequenceClassification", "MobileBertConfig",
                                                intermediate_size=128, embedding_size=64, intra_bottleneck_size=64,
                                                true_hidden_size=64, num_feedforward_networks=2, num_labels=10,
                                                **SMALL), _ids, _classes,
            ("model.classifier.*",), ("model.mobilebert.encoder.layer.1.*", "model.classifier.*")),
    ZooCase("data2vec_audio_small", "held-out", _data2vec_audio, _audio, _classes,
            ("model.classifier.*", "model.projector.*"),
            ("model.data2vec_audio.encoder.layers.1.*", "model.projector.*", "model.classifier.*")),
    ZooCase("gptj_small", "held-out", _hf("GPTJForCausalLM", "GPTJConfig", vocab_size=1000, n_layer=2, n_embd=128,
                                          n_head=4, n_positions=64, rotary_dim=16), _ids, _tokens,
            ("model.lm_head.*",), ("model.transformer.h.1.*", "model.transformer.ln_f.*", "model.lm_head.*")),
]
HALVES = {case.name: case.half for case in CASES}

# variants measured at the small batch: (label, onnxmem options beyond the optimizer)
VARIANTS = ("amp-bf16", "amp-fp16", "frozen backbone", "train subset", "grad-accum 2", "checkpoint",
            "checkpoint amp-bf16")
# checkpointing each block as its library does (--checkpoint layers): transformers' gradient_checkpointing_enable()
# (use_reentrant=False, its default), timm's set_grad_checkpointing() (timm's default: non-reentrant), the hand-written
# models' torch.utils.checkpoint around each block; not measured where the model has no checkpointing (hand_lstm:
# no repeated block, onnxmem refuses; timm dla46_c: set_grad_checkpointing is not supported)
NOT_CHECKPOINTED = ("hand_lstm", "dla46_c")


def enable_checkpointing(module: nn.Module) -> None:
    """Checkpoint each repeated block of a zoo model, as its library (or its hand-written forward) does."""
    inner = getattr(module, "model", None)
    if inner is not None and hasattr(inner, "gradient_checkpointing_enable"):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(module, "set_grad_checkpointing"):
        module.set_grad_checkpointing(True)
    elif hasattr(module, "checkpointing"):
        module.checkpointing = True
    else:
        raise ValueError(f"{type(module).__name__} has no activation checkpointing")


def case_named(name: str) -> ZooCase:
    return next(c for c in CASES if c.name == name)


# ---------------------------------------------------------------------------------------------------------------
# One PyTorch step


def make_step(case: ZooCase, state: dict[str, torch.Tensor], optimizer: str, batch: int, variant: str) \
        -> tuple[nn.Module, torch.optim.Optimizer, tuple[torch.Tensor, ...], Callable[[], None]]:
    """Give a fresh copy of the model (weights from `state`), its optimizer, its inputs and its first step as the
    variant trains it."""
    torch.manual_seed(0)
    module = case.build()
    module.load_state_dict(state)
    module.train()
    patterns = {"frozen backbone": case.head, "train subset": case.subset}.get(variant)
    if patterns is not None:
        for name, parameter in module.named_parameters():
            parameter.requires_grad_(any(fnmatch.fnmatchcase(name, p) for p in patterns))
    if variant.startswith("checkpoint"):
        enable_checkpointing(module)
    inputs = case.inputs(batch)
    opt = OPTIMIZERS[optimizer]([p for p in module.parameters() if p.requires_grad])
    dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16, "checkpoint amp-bf16": torch.bfloat16}.get(variant)
    step = variant_step(module, inputs, batch, case.loss, opt, 2 if variant == "grad-accum 2" else 1, dtype)
    return module, opt, inputs, step


def memtracker_peak(case: ZooCase, state: dict[str, torch.Tensor], optimizer: str, batch: int, variant: str) \
        -> int | None:
    """Give MemTracker's peak of the first step less the parameters, buffers and inputs (None if it fails)."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker

        module, opt, inputs, step = make_step(case, state, optimizer, batch, variant)
        before = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers(), *inputs))
        tracker = MemTracker()
        tracker.track_external(module, opt, *inputs)
        with tracker:
            step()
        peak = tracker.get_tracker_snapshot("peak")  # {device: {reference type: bytes, ..., "Total": their sum}}
        return int(sum(per["Total"] for device, per in peak.items() if str(device) == "cpu")) - before
    except Exception as error:  # noqa: BLE001
        print(f"  MemTracker failed on {case.name} {variant}: {type(error).__name__}: {error}"[:300], file=sys.stderr)
        return None


# ---------------------------------------------------------------------------------------------------------------
# The fork server: every row's heap in a process that has made no step


def serve() -> None:
    """Import everything once, then for each request line (JSON) fork a child that measures one first step and
    prints '@@ <bytes>' (or '@@ error ...')."""
    sys.path.insert(0, str(TOOLS))
    __import__("tvshim")
    import timm  # noqa: F401
    import torchvision  # noqa: F401
    import transformers  # noqa: F401

    torch.set_num_threads(1)
    print("@@ ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                warm_up()
                case = case_named(request["model"])
                state = torch.load(request["state"])
                _, _, _, step = make_step(case, state, request["optimizer"], request["batch"], request["variant"])
                heap = heap_peak(step)
                check_measurement()
                print(f"@@ {heap}", flush=True)
            except BaseException as error:  # noqa: BLE001
                print(f"@@ error {type(error).__name__}: {error}".replace("\n", " ")[:400], flush=True)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


class Server:
    """The fork server as a child process of this one (both under the malloc counter)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self._answer() == "ready"

    def _answer(self) -> str:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("@@ "):
                return line[3:].strip()
        raise RuntimeError("the fork server ended")

    def heap(self, model: str, state: Path, optimizer: str, batch: int, variant: str) -> int | str:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"model": model, "state": str(state), "optimizer": optimizer,
                                             "batch": batch, "variant": variant}) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        return int(answer) if not answer.startswith("error") else answer

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


# ---------------------------------------------------------------------------------------------------------------
# Estimates


def export_both(case: ZooCase, folder: Path) -> tuple[Path | None, Path, Path]:
    """Give the default export (None where it fails), the recommended one and the saved weights, made once."""
    from onnxmem.torch import export_for_training

    default, recommended = folder / f"{case.name}.default.onnx", folder / f"{case.name}.train.onnx"
    state_path = folder / f"{case.name}.state.pt"
    if recommended.exists() and state_path.exists():
        return (default if default.exists() else None), recommended, state_path
    torch.manual_seed(0)
    reference = case.build()
    torch.save({k: v.clone() for k, v in reference.state_dict().items()}, state_path)
    with quiet():
        export_for_training(reference, case.inputs(2), recommended, {"batch": 0})
    try:
        with quiet():
            torch.onnx.export(reference.eval(), case.inputs(case.batches[0]), str(default), dynamo=True)
    except Exception as error:  # noqa: BLE001
        print(f"  default export of {case.name} failed: {type(error).__name__}: {error}"[:300], file=sys.stderr)
        default.unlink(missing_ok=True)
    return (default if default.exists() else None), recommended, state_path


def estimate(path: Path, dims: dict[str, int], case: ZooCase, optimizer: str, variant: str) -> tuple[int, str]:
    """Give onnxmem's first-step peak above weights and inputs, and the report's warning codes."""
    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.training.step import TrainingOptions

    report = onnxmem.analyze(path, dims, training=TrainingOptions(
        optimizer=optimizer, device=TorchCpu(threads=1), loss="cross_entropy",
        precision=variant.removeprefix("checkpoint ") if "amp-" in variant else "fp32",
        train={"frozen backbone": case.head, "train subset": case.subset}.get(variant, ()),
        grad_accum=2 if variant == "grad-accum 2" else 1,
        checkpoint=case.checkpointed if variant.startswith("checkpoint") else None))
    training = report.training
    assert training is not None
    # the inference report's own (CUDA placement) warnings are not the training step's
    codes = sorted({w.code for w in report.warnings if not w.code.startswith("cuda-")})
    return training.first_step.peak_bytes - training.weights_bytes - training.input_bytes, ",".join(codes) or "-"


@dataclass
class ZooRow:
    model: str
    half: str
    batch: int
    variant: str  # "fp32" or a VARIANTS entry
    optimizer: str
    heap: int | None
    memtracker: int | None
    estimate: int | None
    warned: str
    default: int | None = None  # the default export's estimate (fp32, small batch)
    default_warned: str = ""

    def error(self, value: int | None) -> float | None:
        return None if value is None or not self.heap else (value - self.heap) / self.heap


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}%"


def _bytes(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def summary(rows: list[ZooRow], pick: Callable[[ZooRow], int | None]) -> str:
    errors = [e for r in rows if (e := r.error(pick(r))) is not None]
    if not errors:
        return "n/a"
    return (f"mean |error| {100 * sum(map(abs, errors)) / len(errors):.1f}%, worst {100 * min(errors):+.1f}% / "
            f"{100 * max(errors):+.1f}%, {sum(e < 0 for e in errors)} of {len(errors)} under")


def run(names: list[str], folder: Path, variants: bool, only: tuple[str, ...] = ()) -> list[ZooRow]:
    server = Server()
    rows: list[ZooRow] = []
    started = time.perf_counter()
    try:
        for case in (case_named(n) for n in names):
            try:
                default, recommended, state_path = export_both(case, folder)
            except Exception as error:  # noqa: BLE001
                print(f"  {case.name}: export failed: {type(error).__name__}: {error}"[:400], file=sys.stderr)
                continue
            state = torch.load(state_path)
            plans = [(b, "fp32", o) for b in case.batches for o in ("sgd", "adamw")]
            plans += [(case.batches[0], v, o) for v in (VARIANTS if variants else ()) for o in ("sgd", "adamw")
                      if not (v.startswith("checkpoint") and case.name in NOT_CHECKPOINTED)]
            if only:
                plans = [plan for plan in plans if plan[1] in only]
            for batch, variant, optimizer in plans:
                heap = server.heap(case.name, state_path, optimizer, batch, variant)
                if isinstance(heap, str):
                    print(f"  {case.name} {variant} {optimizer} {batch}: {heap}", file=sys.stderr)
                    heap_value: int | None = None
                else:
                    heap_value = heap
                tracker = memtracker_peak(case, state, optimizer, batch, "" if variant == "fp32" else variant)
                try:
                    ours, warned = estimate(recommended, {"batch": batch}, case, optimizer, variant)
                except Exception as error:  # noqa: BLE001
                    print(f"  {case.name} {variant}: estimate failed: {error}"[:300], file=sys.stderr)
                    ours, warned = None, "failed"
                row = ZooRow(case.name, case.half, batch, variant, optimizer, heap_value, tracker, ours, warned)
                if variant == "fp32" and batch == case.batches[0] and default is not None:
                    try:
                        row.default, row.default_warned = estimate(default, {}, case, optimizer, variant)
                    except Exception as error:  # noqa: BLE001
                        print(f"  {case.name}: default estimate failed: {error}"[:300], file=sys.stderr)
                rows.append(row)
            print(f"  {case.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    finally:
        server.close()
    return rows


def render(rows: list[ZooRow]) -> str:
    out = ["| half | model | batch | variant | optimizer | heap (truth) | estimate | error | MemTracker | error "
           "| warnings |", "|---|---|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r.half} | {r.model} | {r.batch} | {r.variant} | {r.optimizer} | {_bytes(r.heap)} "
                   f"| {_bytes(r.estimate)} | {_percent(r.error(r.estimate))} | {_bytes(r.memtracker)} "
                   f"| {_percent(r.error(r.memtracker))} | {r.warned} |")
    out += ["", "Plain default export (torch.onnx.export(model.eval(), dynamo=True), fp32, small batch), against "
            "the same truth:", "", "| half | model | optimizer | heap (truth) | default export | error "
            "| warnings |", "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        if r.variant == "fp32" and r.batch == case_named(r.model).batches[0]:
            out.append(f"| {r.half} | {r.model} | {r.optimizer} | {_bytes(r.heap)} | {_bytes(r.default)} "
                       f"| {_percent(r.error(r.default))} | {r.default_warned or 'export failed'} |")
    out += ["", "| half | variant | rows | onnxmem | MemTracker |", "|---|---|---:|---|---|"]
    for half in ("dev", "held-out", "all"):
        for variant in ("fp32", *VARIANTS):
            picked = [r for r in rows if r.variant == variant and (half == "all" or r.half == half)]
            if picked:
                out.append(f"| {half} | {variant} | {len(picked)} | {summary(picked, lambda r: r.estimate)} "
                           f"| {summary(picked, lambda r: r.memtracker)} |")
        picked = [r for r in rows if r.default is not None and (half == "all" or r.half == half)]
        if picked:
            out.append(f"| {half} | default export | {len(picked)} | {summary(picked, lambda r: r.default)} | |")
    return "\n".join(out)


def compare(before: list[ZooRow], after: list[ZooRow]) -> str:
    """Give the rows whose estimate changed (before -> after, the same truth) and each half's summary before and
    after, per variant."""
    out = ["| half | model | batch | variant | optimizer | heap (truth) | before | error | after | error | warnings |",
           "|---|---|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for b, a in zip(before, after, strict=True):
        if b.estimate != a.estimate:
            out.append(f"| {a.half} | {a.model} | {a.batch} | {a.variant} | {a.optimizer} | {_bytes(a.heap)} "
                       f"| {_bytes(b.estimate)} | {_percent(b.error(b.estimate))} | {_bytes(a.estimate)} "
                       f"| {_percent(a.error(a.estimate))} | {a.warned} |")
    out += ["", "| half | variant | rows | before | after | MemTracker |", "|---|---|---:|---|---|---|"]
    for half in ("dev", "held-out"):
        for variant in ("fp32", *VARIANTS):
            pairs = [(b, a) for b, a in zip(before, after, strict=True) if a.variant == variant and a.half == half]
            if pairs:
                was, now = (summary([pair[i] for pair in pairs], lambda r: r.estimate) for i in (0, 1))
                tracker = summary([a for _, a in pairs], lambda r: r.memtracker)
                out.append(f"| {half} | {variant} | {len(pairs)} | {was} | {now} | {tracker} |")
    return "\n".join(out)


def estimate_again(path: Path, folder: Path) -> None:
    """Recompute the estimates of the rows in `path` (on the exports in `folder`) and rewrite them."""
    rows = json.loads(path.read_text())
    for row in rows:
        case = case_named(row["model"])
        variant = row["variant"]
        row["estimate"], row["warned"] = estimate(folder / f"{case.name}.train.onnx", {"batch": row["batch"]}, case,
                                                  row["optimizer"], variant)
        if row.get("default") is not None:
            row["default"], row["default_warned"] = estimate(folder / f"{case.name}.default.onnx", {}, case,
                                                             row["optimizer"], variant)
    path.write_text(json.dumps(rows, indent=1))


def memtracker_again(path: Path, folder: Path) -> None:
    """Measure MemTracker's column of the rows in `path` again (with the exports' saved weights) and rewrite it."""
    sys.path.insert(0, str(TOOLS))
    __import__("tvshim")
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    rows = json.loads(path.read_text())
    for row in rows:
        case = case_named(row["model"])
        state = torch.load(folder / f"{case.name}.state.pt")
        row["memtracker"] = memtracker_peak(case, state, row["optimizer"], row["batch"],
                                            "" if row["variant"] == "fp32" else row["variant"])
    path.write_text(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="", help="comma-separated model names (default: the half's)")
    parser.add_argument("--half", choices=("dev", "held-out", "all"), default="all")
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "onnxmem-training-zoo")
    parser.add_argument("--no-variants", action="store_true")
    parser.add_argument("--variants", default="", help="comma-separated: measure only these variants ('fp32', "
                        "'checkpoint', 'checkpoint amp-bf16', ...)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--merge", default="", help="comma-separated JSON files of rows (--json): render them only")
    parser.add_argument("--memtracker-again", type=Path,
                        help="a JSON file of rows (--json): measure MemTracker's column again and rewrite it")
    parser.add_argument("--estimate-again", type=Path,
                        help="a JSON file of rows (--json): recompute onnxmem's estimates (a rule changes only them; "
                             "the truth and MemTracker columns are kept) and rewrite it")
    parser.add_argument("--compare", default="",
                        help="BEFORE.json,AFTER.json (rows in the same order, --estimate-again of a copy): print the "
                             "rows whose estimate changed and each half's summary before and after")
    parser.add_argument("--checkpointed", default="",
                        help="MODEL=SPEC[;MODEL=SPEC]: estimate MODEL's checkpoint rows with --checkpoint SPEC instead "
                             "of its own (the placement its library uses, where the rule takes another)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for item in filter(None, args.checkpointed.split(";")):
        model, _, spec = item.partition("=")
        CASES[CASES.index(case_named(model))] = dataclasses.replace(case_named(model), checkpointed=spec)
    if args.estimate_again:
        estimate_again(args.estimate_again, args.out)
        return
    if args.memtracker_again:
        memtracker_again(args.memtracker_again, args.out)
        return
    if args.compare:
        before, after = ([ZooRow(**r) for r in json.loads(Path(f).read_text())] for f in args.compare.split(","))
        print(compare(before, after))
        return
    if args.merge:
        rows = [ZooRow(**r) for f in args.merge.split(",") for r in json.loads(Path(f).read_text())]
        order = [c.name for c in CASES]
        print(render(sorted(rows, key=lambda r: order.index(r.model))))
        return
    under_malloc_counter()
    if args.serve:
        serve()
        return
    sys.path.insert(0, str(TOOLS))
    __import__("tvshim")
    import timm  # noqa: F401
    import torchvision  # noqa: F401
    import transformers  # noqa: F401

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    started = time.perf_counter()
    check_measurement()
    wanted = [n for n in args.models.split(",") if n] or [c.name for c in CASES
                                                           if args.half in ("all", c.half)]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run(wanted, args.out, not args.no_variants, tuple(v for v in args.variants.split(",") if v))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    print(f"torch {torch.__version__}, CPU, one thread; first training step; bytes above weights and inputs; truth: "
          "every heap byte (malloc counter); error = (estimate - truth) / truth")
    print()
    print(render(rows))
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

"""LoRA: onnxmem's `--lora` training step against PyTorch's, on PEFT-wrapped models of the training zoo.

    python benchmarks/lora_truth.py [--models hand_llama,hand_gpt,phi3_small,falcon_small] [--out DIR]

Each model of benchmarks/training_zoo.py named is wrapped by PEFT (peft.get_peft_model with LoraConfig(r=8,
lora_alpha=16, lora_dropout=0, the target modules below); the model PEFT injected its adapters into is what is
trained and exported): PEFT freezes the base and leaves the adapters trainable. The truth is training_zoo's: the
first step's heap peak above what was live before it (every malloc: the LD_PRELOAD counter), one thread, each row
in a fork of a process that has made no step. The estimate: onnxmem.torch.export_for_training of the same model,
then TrainingOptions(lora=True) (PEFT's *.lora_* parameters train, nothing written by hand), CPU, one thread. Rows:
fp32 at batch 4 and 8, sgd and adamw. error = (estimate - truth) / truth.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmarks.training_zoo as zoo  # noqa: E402
from benchmarks.accuracy_training import check_measurement, under_malloc_counter  # noqa: E402
from benchmarks.training_zoo import TOOLS, ZooCase, quiet, torch  # noqa: E402

# the Linear layers PEFT adapts, per zoo model (its attention projections)
TARGETS = {
    "hand_llama": ["q", "k", "v", "o"],
    "hand_gpt": ["qkv", "proj"],
    "phi3_small": ["qkv_proj", "o_proj"],
    "falcon_small": ["query_key_value", "dense"],
}
RANK = 8
SUFFIX = "+lora"


def _with_lora(build: Callable[[], Any], targets: list[str]) -> Callable[[], Any]:
    def made() -> Any:
        import peft

        model = build()
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0,
                                                             target_modules=targets))
        return wrapped.get_base_model()
    return made


def lora_case(name: str) -> ZooCase:
    base = zoo.case_named(name)
    return replace(base, name=name + SUFFIX, build=_with_lora(base.build, TARGETS[name]))


# the LoRA cases join the zoo's, so that its fork server (`--serve`, below) finds them by name
zoo.CASES.extend(lora_case(name) for name in TARGETS)


class Server(zoo.Server):
    """training_zoo's fork server, run from this file (whose import adds the LoRA cases)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self._answer() == "ready"


def export(case: ZooCase, folder: Path) -> tuple[Path, Path]:
    """Give the recommended export and the saved weights (made once)."""
    from onnxmem.torch import export_for_training

    path, state_path = folder / f"{case.name}.train.onnx", folder / f"{case.name}.state.pt"
    if path.exists() and state_path.exists():
        return path, state_path
    torch.manual_seed(0)
    reference = case.build()
    torch.save({k: v.clone() for k, v in reference.state_dict().items()}, state_path)
    with quiet():
        export_for_training(reference, case.inputs(2), path, {"batch": 0})
    return path, state_path


def estimate(path: Path, batch: int, optimizer: str) -> tuple[int, int, str]:
    """Give onnxmem's first-step peak above weights and inputs, the trainable parameters and the warning codes."""
    import onnxmem
    from onnxmem.targets.torch import TorchCpu
    from onnxmem.training.step import TrainingOptions

    report = onnxmem.analyze(path, {"batch": batch}, training=TrainingOptions(
        optimizer=optimizer, device=TorchCpu(threads=1), loss="cross_entropy", lora=True))
    training = report.training
    assert training is not None
    codes = sorted({w.code for w in report.warnings if not w.code.startswith("cuda-")})
    return (training.first_step.peak_bytes - training.weights_bytes - training.input_bytes,
            training.trainable_parameters, ",".join(codes) or "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(TARGETS))
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "onnxmem-lora-truth")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    under_malloc_counter()
    if args.serve:
        zoo.serve()
        return
    sys.path.insert(0, str(TOOLS))
    __import__("tvshim")
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    started = time.perf_counter()
    check_measurement()
    args.out.mkdir(parents=True, exist_ok=True)
    server = Server()
    rows: list[dict[str, Any]] = []
    try:
        for name in args.models.split(","):
            case = zoo.case_named(name + SUFFIX)
            path, state = export(case, args.out)
            torch.manual_seed(0)
            model = case.build()
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            for batch in case.batches:
                for optimizer in ("sgd", "adamw"):
                    heap = server.heap(case.name, state, optimizer, batch, "fp32")
                    guess, counted, codes = estimate(path, batch, optimizer)
                    rows.append({"model": name, "batch": batch, "optimizer": optimizer, "trainable": trainable,
                                 "counted": counted, "heap": heap, "estimate": guess, "warned": codes})
                    print(f"  {name} b{batch} {optimizer}: {heap} vs {guess}", file=sys.stderr, flush=True)
    finally:
        server.close()
    print(f"torch {torch.__version__}, CPU, fp32, one thread; PEFT LoRA r={RANK}; first training step; bytes above "
          "weights and inputs; truth: every heap byte (malloc counter); error = (estimate - truth) / truth")
    print()
    print("| model | batch | optimizer | trainable (PyTorch) | trainable (onnxmem --lora) | truth B | onnxmem B | "
          "error | warnings |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    errors = []
    for r in rows:
        heap = r["heap"]
        error = (r["estimate"] - heap) / heap if isinstance(heap, int) and heap else None
        if error is not None:
            errors.append(abs(error))
        print(f"| {r['model']} | {r['batch']} | {r['optimizer']} | {r['trainable']:,} | {r['counted']:,} | "
              f"{heap if not isinstance(heap, int) else f'{heap:,}'} | {r['estimate']:,} | "
              f"{'-' if error is None else f'{error:+.1%}'} | {r['warned']} |")
    if errors:
        print(f"\n{len(errors)} rows: mean |error| {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}; "
              f"{time.perf_counter() - started:.0f} s")
    Path(args.out / "rows.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

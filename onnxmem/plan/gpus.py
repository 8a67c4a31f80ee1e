"""The GPU catalogue: each GPU's memory as its driver reports it where that is known, the product's nominal size
where not, and the names nvidia-smi gives it, so `--gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader)"`
works as it is."""

from __future__ import annotations

import re
from dataclasses import dataclass

from onnxmem.errors import TargetError

MiB, GiB = 2**20, 2**30


@dataclass(frozen=True)
class Gpu:
    """A GPU of the catalogue: its memory, where that figure comes from, and the names the driver gives it."""

    name: str
    memory_bytes: int
    source: str
    aliases: tuple[str, ...] = ()  # as nvidia-smi --query-gpu=name writes them


# nvidia-smi's memory.total is what the driver reports of the board (a little under the nominal size on most: ECC
# and the driver's own reservations); the CUDA context and the libraries then take more, counted by fit's runtimes.
_DRIVER = "nvidia-smi memory.total as the driver reports it on this board (MiB), from vendor and user reports, " \
          "not measured by onnxmem"
_NOMINAL = "nominal capacity (the product's stated size, read as GiB); the driver reports a little less on most " \
           "boards: pass --memory with nvidia-smi's memory.total for an exact figure"


def _driver(name: str, mib: int, *aliases: str) -> Gpu:
    return Gpu(name, mib * MiB, _DRIVER, aliases)


# measured on a GPU lent to the project: what CUDA lets a process use (cudaMemGetInfo's total), which is less than
# nvidia-smi's memory.total by what the driver keeps (on the H100: 480 MiB, NVML's `used` before any process)
_MEASURED = "measured: cudaMemGetInfo's total (what a CUDA process can use; nvidia-smi's memory.total is " \
            "{smi:,} MiB) on an {board}, driver {driver} (benchmarks/results/cuda/{rows})"


def _measured(name: str, total: int, smi_mib: int, board: str, driver: str, rows: str, *aliases: str) -> Gpu:
    return Gpu(name, total, _MEASURED.format(smi=smi_mib, board=board, driver=driver, rows=rows), aliases)


def _nominal(name: str, gib: int, *aliases: str) -> Gpu:
    return Gpu(name, gib * GiB, _NOMINAL, aliases)


GPUS: dict[str, Gpu] = {g.name: g for g in (
    _driver("T4-16GB", 15360, "Tesla T4"),
    _nominal("V100-16GB", 16, "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"),
    _nominal("V100-32GB", 32, "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB"),
    _driver("A10-24GB", 23028, "NVIDIA A10", "NVIDIA A10G"),
    _driver("L4-24GB", 23034, "NVIDIA L4"),
    _driver("RTX3090-24GB", 24576, "NVIDIA GeForce RTX 3090"),
    _nominal("RTX4060Ti-16GB", 16, "NVIDIA GeForce RTX 4060 Ti"),
    _nominal("RTX4070Ti-12GB", 12, "NVIDIA GeForce RTX 4070 Ti"),
    _nominal("RTX4080-16GB", 16, "NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 4080 SUPER"),
    _driver("RTX4090-24GB", 24564, "NVIDIA GeForce RTX 4090"),
    _nominal("RTX5090-32GB", 32, "NVIDIA GeForce RTX 5090"),
    _driver("A100-40GB", 40960, "NVIDIA A100-SXM4-40GB"),
    _driver("A100-80GB", 81920, "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
    _driver("A6000-48GB", 49140, "NVIDIA RTX A6000"),
    _driver("A40-48GB", 46068, "NVIDIA A40"),
    _driver("L40-48GB", 46068, "NVIDIA L40"),
    _driver("L40S-48GB", 46068, "NVIDIA L40S"),
    _measured("H100-80GB", 85_017_493_504, 81559, "NVIDIA H100 80GB HBM3", "580.159.04",
              "2026-11-27-h100-80gb.jsonl", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
    _nominal("H100-94GB", 94, "NVIDIA H100 NVL"),
    _driver("H200-141GB", 143771, "NVIDIA H200"),
    _nominal("B200-180GB", 180, "NVIDIA B200"),
    _nominal("GB200-186GB", 186, "NVIDIA GB200"),
    _nominal("MI300X-192GB", 192, "AMD Instinct MI300X"),
)}


def find_gpu(name: str) -> Gpu:
    """Give the catalogue's GPU for a name: its own ('a100-80gb', matched without case, spaces, dashes or
    underscores, or by a unique prefix) or one nvidia-smi gives it ('NVIDIA A100-SXM4-80GB')."""
    key = _gpu_key(name)
    exact = [g for g in GPUS.values() if key in _names(g)]
    if exact:
        return exact[0]
    # a model without its memory: found where one GPU has it ('L40'), ambiguous where several do ('A100')
    model = [g for g in GPUS.values() if key == _gpu_key(g.name.rpartition("-")[0])]
    prefix = model or ([g for g in GPUS.values() if _gpu_key(g.name).startswith(key)] if key else [])
    if len(prefix) == 1:
        return prefix[0]
    if prefix:
        raise TargetError(f"GPU '{name}' is ambiguous: it could be {', '.join(g.name for g in prefix)}")
    raise TargetError(f"GPU '{name}' is not in the catalog ({', '.join(GPUS)}); give the memory instead "
                      "(--memory SIZE, or memory= in Python; nvidia-smi --query-gpu=memory.total gives it)")


def _gpu_key(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).lower()


_VENDOR_WORDS = re.compile(r"^(nvidia|amd|tesla|geforce|instinct|\s)+", re.IGNORECASE)


def _names(gpu: Gpu) -> set[str]:
    """Give the keys a GPU is found by exactly: its name, and the driver's names with and without the vendor's
    words ('NVIDIA GeForce RTX 4090', 'RTX 4090')."""
    return {_gpu_key(gpu.name), *(_gpu_key(a) for a in gpu.aliases),
            *(_gpu_key(_VENDOR_WORDS.sub("", a)) for a in gpu.aliases)}

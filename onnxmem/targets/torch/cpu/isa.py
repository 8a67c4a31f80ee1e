"""The instruction set of the CPU onnxmem runs on (the default of TorchCpu.isa)."""

from __future__ import annotations


def detect_cpu_isa(cpuinfo: str = "/proc/cpuinfo") -> str:
    """Give the key of tables.py CPU_ISAS for the CPU this runs on: avx512 where its flags show AVX-512 BW, VL
    and DQ (what ATen and oneDNN require of their AVX-512 kernels), else avx2 (also where the flags cannot be read:
    not Linux, not x86)."""
    if cpuinfo not in _DETECTED:
        try:
            with open(cpuinfo, encoding="ascii", errors="replace") as file:
                flags = next((line.split(":", 1)[1].split() for line in file if line.startswith("flags")), [])
        except OSError:
            flags = []
        _DETECTED[cpuinfo] = "avx512" if {"avx512bw", "avx512vl", "avx512dq"} <= set(flags) else "avx2"
    return _DETECTED[cpuinfo]


_DETECTED: dict[str, str] = {}  # detect_cpu_isa's answer per file: read once

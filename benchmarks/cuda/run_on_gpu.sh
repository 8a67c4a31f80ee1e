#!/usr/bin/env bash
# The one command of a GPU window (pass exactly this to the device tool's run, timeout_s 600, carry [".ortgpu"]
# when the onnxruntime-gpu bundle is there): bash benchmarks/cuda/run_on_gpu.sh
# Runs the CUDA truth campaign into $OUT (rows.jsonl, exports.zip, campaign.log) inside 8 minutes; skips what
# benchmarks/results/cuda already holds, so a later window measures the part not yet measured.
set -u
OUT="${OUT:-/tmp/cuda-campaign-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="$(command -v python3)"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
# the campaign stops starting cases at its budget (450 s); timeout is the last guard (480 s = 8 minutes)
timeout -k 10 480 "$PY" benchmarks/cuda/campaign.py --out "$OUT" --work /tmp/cuda-campaign-work \
    --budget-s 450 --skip-done benchmarks/results/cuda "$@" 2>&1 | tee "$OUT/campaign.log"
status=${PIPESTATUS[0]}
ls -la "$OUT"
echo "campaign exit status: $status"
exit 0

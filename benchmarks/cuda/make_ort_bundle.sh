#!/usr/bin/env bash
# Make .ortgpu: onnxruntime-gpu 1.31.1 for the GPU machine's Python 3.12 in about 45 MB (the Hopper code only), as
# ../shared/tools/ort-gpu/README.md describes; the campaign's ORT part rebuilds it there from this folder.
# About 35 minutes on 2 cores: start it in the background at the start of a session that may get a GPU. The other
# parts of the campaign do not need it (their rows come first; the ORT rows say "skipped" and a later window
# measures them). Needs the zstd CLI (apt-get install -y zstd).
set -euo pipefail
cd "$(dirname "$0")/../.."
TOOLS="${ONNXMEM_TOOLS:-../shared/tools}/ort-gpu"
DL="$(mktemp -d)"
grep -qx '/.ortgpu/' .git/info/exclude 2>/dev/null || echo '/.ortgpu/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$DL" onnxruntime-gpu==1.31.1
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d "$DL" zstandard==0.25.0
python3 -m pip install -q --target "$DL/zs" zstandard==0.25.0
rm -rf .ortgpu
PYTHONPATH="$DL/zs" python3 "$TOOLS/ort_bundle.py" "$DL"/onnxruntime_gpu-1.31.1-*.whl "$DL"/zstandard-0.25.0-*.whl .ortgpu
cp "$TOOLS/ort_rebuild.py" .ortgpu/
du -sh .ortgpu

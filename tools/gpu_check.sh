#!/usr/bin/env bash
# The GPU check, one command on a machine with an NVIDIA GPU (about 5 minutes):
#   tools/gpu_check.sh OUT_DIR
# (0) repeatability: a small scenario run twice on the GPU gives the same parameters; prints
# "deterministic on <GPU>: same sha" or the difference (without a GPU: the same on the CPU),
# (1) lock-step training on cuda against the CPU, (2) four DeviceActors packed on one GPU at
# num_gpus 0.25, (3) seconds per round at 5000/500 and 100000/10000, GPU against CPU.
# Results: OUT_DIR/gpu_check.md (the table), OUT_DIR/gpu_check.json, OUT_DIR/gpu_check.log.
# Extra arguments go to tools/gpu_check.py (e.g. --sizes 5000:500 --cpu-only).
set -euo pipefail
out=${1:?usage: tools/gpu_check.sh OUT_DIR [gpu_check.py options]}
shift
cd "$(dirname "$0")/../.."
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi: not available" > "$out/nvidia-smi.txt"
export RAYMM_NO_PROGRESS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 480 "$python" tools/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log"

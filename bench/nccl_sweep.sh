#!/usr/bin/env bash
# NCCL all-reduce sweep on a GPU machine: NVLink as found, then with P2P disabled; eager and CUDA graphs.
# Usage: bench/nccl_sweep.sh GPUS OUTDIR   (run from the repository root; needs torch with CUDA)
set -uo pipefail
GPUS=${1:-2}; OUT=${2:-bench/results}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
SD="python3 -m specdeploy.cli"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
$SD nccl topo --matrix "$OUT/topo.txt" | tee "$OUT/topo-notes.txt"
$SD nccl tune --gpus "$GPUS" --iters 40 --timeout 120 --out "$OUT/nvlink.json"
$SD nccl choose "$OUT/nvlink.json" --tuner-csv "$OUT/nvlink-tuner.csv" --chart "$OUT/nvlink.png" | tee "$OUT/nvlink-choice.txt"
$SD nccl tune --gpus "$GPUS" --iters 40 --timeout 120 --base-env NCCL_P2P_DISABLE=1 --out "$OUT/p2p-off.json"
$SD nccl choose "$OUT/p2p-off.json" --tuner-csv "$OUT/p2p-off-tuner.csv" --chart "$OUT/p2p-off.png" | tee "$OUT/p2p-off-choice.txt"

#!/usr/bin/env bash
# NCCL all-reduce sweep on a GPU machine, in interleaved rounds: NVLink as found (every candidate), then P2P
# disabled (a short list). Each round runs every candidate, the default and its A/A twin in a fresh shuffled order.
# Usage: bench/nccl_sweep.sh GPUS OUTDIR   (run from the repository root; needs torch with CUDA)
#        ROUNDS=5 ITERS=40 bench/nccl_sweep.sh 2 out/
set -uo pipefail
GPUS=${1:-2}; OUT=${2:-bench/results}; ROUNDS=${ROUNDS:-5}; ITERS=${ITERS:-40}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
SD="python3 -m specdeploy.cli"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  >> "$OUT/topo.txt" 2>&1
$SD nccl tune --gpus "$GPUS" --rounds "$ROUNDS" --modes graph --iters "$ITERS" --timeout 60 --seed 1701 \
  --out "$OUT/nvlink.json"
$SD nccl choose "$OUT/nvlink.json" | tee "$OUT/nvlink-choice.txt"
$SD nccl tune --gpus "$GPUS" --rounds "$ROUNDS" --modes graph --iters "$ITERS" --timeout 60 --seed 1702 \
  --only default,min_ctas=16,seeds,Ring/Simple --base-env NCCL_P2P_DISABLE=1 --out "$OUT/p2p-off.json"
$SD nccl choose "$OUT/p2p-off.json" | tee "$OUT/p2p-off-choice.txt"

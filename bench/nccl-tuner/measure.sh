#!/usr/bin/env bash
# The tuner plugin against the best global environments, in the same interleaved rounds (GPU machine).
# Usage: NCCL_TUNER_INCLUDE=DIR bench/nccl-tuner/measure.sh GPUS OUTDIR TUNER_CSV
#        (run from the repository root; ROUNDS=8 by default)
set -euo pipefail
GPUS=${1:-2}; OUT=${2:-bench/results}; CSV=$(realpath "${3:?per-size CSV from nccl choose --tuner-csv}")
ROUNDS=${ROUNDS:-8}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
LIB=$(realpath "$OUT")/libnccl-tuner-specdeploy.so
bash "$(dirname "$0")/build.sh" "$LIB"
# Does NCCL load it? One short run with NCCL's own log.
for r in $(seq 0 $((GPUS - 1))); do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_TUNER_PLUGIN=$LIB NCCL_TUNER_CONFIG_FILE=$CSV \
  RANK=$r WORLD_SIZE=$GPUS LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 \
  python3 -m specdeploy.nccl.worker '{"hidden":7168,"tokens":[2,256,8192],"modes":["graph"],"iters":5,
    "graph_ops":2,"out":"/tmp/plugin-check.json"}' > "$OUT/plugin-check-$r.log" 2>&1 &
done
wait
grep -ih "tuner" "$OUT/plugin-check-0.log" | head -5
cat > "$OUT/candidates.yml" <<YML
min_ctas=16: {NCCL_MIN_CTAS: "16"}
Ring/LL: {NCCL_ALGO: Ring, NCCL_PROTO: LL}
tuner-plugin: {NCCL_TUNER_PLUGIN: "$LIB", NCCL_TUNER_CONFIG_FILE: "$CSV"}
YML
python3 -m specdeploy.cli nccl tune --gpus "$GPUS" --rounds "$ROUNDS" --modes graph --iters 40 --timeout 60 \
  --seed 1703 --candidates "$OUT/candidates.yml" --out "$OUT/nvlink-plugin.json" | grep -v "round [0-9]* "
python3 -m specdeploy.cli nccl choose "$OUT/nvlink-plugin.json" | tee "$OUT/nvlink-plugin-choice.txt"

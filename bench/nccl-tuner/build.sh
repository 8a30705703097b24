#!/usr/bin/env bash
# Build specdeploy's NCCL tuner plugin. NCCL_TUNER_INCLUDE: the directory holding NCCL's tuner.h, common.h and
# err.h (plugins/tuner/example/nccl/ of an NCCL source tree at the version the engine uses); not shipped here.
# Usage: NCCL_TUNER_INCLUDE=/path/to/nccl/plugins/tuner/example/nccl bench/nccl-tuner/build.sh OUT.so
set -euo pipefail
: "${NCCL_TUNER_INCLUDE:?set NCCL_TUNER_INCLUDE to the directory holding tuner.h}"
OUT=${1:-libnccl-tuner-specdeploy.so}
cc -O2 -Wall -Wextra -Werror -fPIC -shared -I"$NCCL_TUNER_INCLUDE" \
  "$(dirname "$0")/specdeploy_tuner.c" -o "$OUT"
echo "built $OUT"

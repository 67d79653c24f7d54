#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: issue 19 items 5 and 3 together, 1B shape, since
# the warm-up serves one and costs the other: launch -> first answer (bench/gpu_startup.sh), then a
# fresh server's first 16-client burst right after /health turns ready (no warm-up by the bench)
# with an empty kernel cache and with the one it left on disk, then the same load warmed.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; m=/tmp/llama-1b
mkdir -p "$out"
ROUNDS=${ROUNDS:-3} bash bench/gpu_startup.sh
burst() {  # name, extra serve_compare flags
  rm -f /tmp/burst.jsonl
  python3 -m bench.serve_compare --model $m --servers mlx-serve --concurrency 16 --direct-runs 0 $2 \
    --env MLX_PTX_CACHE_DIR=/tmp/ptx-burst --mlx-serve-args="--trace /tmp/burst.jsonl" \
    --log-dir /tmp/logs-burst-$1 2>&1 | tee "$out/h200-burst16-$1.txt"
  python3 -m bench.trace_summary /tmp/burst.jsonl 2>&1 | tee -a "$out/h200-burst16-$1.txt"
  grep -h "warm-up\|rows decoded" /tmp/logs-burst-$1/mlx-serve.log | tee -a "$out/h200-burst16-$1.txt"
}
burst fresh --no-warmup
burst disk --no-warmup
burst warmed ""

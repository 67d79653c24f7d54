#!/usr/bin/env bash
# On the borrowed H200, after build/gpu/b/install.sh: issue 19's engine-speed run, 1B shape bf16.
#   TAG=-before bash bench/gpu_speed.sh      # outputs under $OUT (h200-speed-*$TAG.txt)
# Order matters: MLX's CUDA kernel cache survives restarts on one machine, so the cold burst
# (a fresh server's first 16 clients, no warm-up) runs first, before anything compiles kernels.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}
tag=${TAG:-}
mkdir -p "$out"
python3 -m bench.make_model --shape 1b --out /tmp/llama-1b --tokenizer-from build/smollm2-tok > /dev/null
m=/tmp/llama-1b
# A fresh server's first 16-client burst, no warm-up by the bench: with an empty kernel cache
# (a fresh machine), then again with the cache that run left on disk (a restart). COLD_ARGS are
# extra server flags for these; NOWARM=1 adds a fresh-cache run with --no-warmup.
cold() {  # name, kernel cache folder, extra server flags
  rm -f /tmp/cold.jsonl
  python3 -m bench.serve_compare --model $m --servers mlx-serve --concurrency 16 --no-warmup --direct-runs 0 \
    --env MLX_PTX_CACHE_DIR=$2 --mlx-serve-args="--trace /tmp/cold.jsonl $3 ${SERVE_ARGS:-}" \
    --log-dir /tmp/logs-cold-$1 2>&1 | tee "$out/h200-speed-cold16-$1$tag.txt"
  python3 -m bench.trace_summary /tmp/cold.jsonl 2>&1 | tee -a "$out/h200-speed-cold16-$1$tag.txt"
  grep -h "warm-up\|rows decoded" /tmp/logs-cold-$1/mlx-serve.log | tee -a "$out/h200-speed-cold16-$1$tag.txt"
}
if [ -z "${NO_COLD:-}" ]; then
  cold fresh /tmp/ptx-cold$tag "${COLD_ARGS:-}"
  cold disk /tmp/ptx-cold$tag "${COLD_ARGS:-}"
fi
[ -n "${NOWARM:-}" ] && cold fresh-nowarmup /tmp/ptx-nowarm$tag --no-warmup
[ -n "${SHAPES:-}" ] && MLX_PTX_CACHE_DIR=/tmp/ptx-shapes$tag python3 -m bench.cold_shapes --model $m 2>&1 | tee "$out/h200-speed-shapes$tag.txt"
for r in $(seq 1 ${ROUNDS:-1}); do  # ROUNDS=N: N rounds of the side-by-side comparison
  suffix=$([ "${ROUNDS:-1}" = 1 ] && echo "" || echo "-round$r")
  python3 -m bench.serve_compare --model $m --servers ${SERVERS:-mlx-serve,mlx_lm} --concurrency 1,16,64 --direct-runs 3 \
    --mlx-serve-args="${SERVE_ARGS:-}" --log-dir /tmp/logs 2>&1 | tee "$out/h200-speed-serve$tag$suffix.txt"
done
python3 - > /tmp/prompts.json <<'PY'
import json
from pathlib import Path
from bench.prompts import PromptBook, load_tokenizer
book = PromptBook(None, load_tokenizer(Path("/tmp/llama-1b")), False)
print(json.dumps([book.get(i).messages for i in range(64)]))
PY
python3 -m bench.direct --model $m --prompts /tmp/prompts.json --runs 3 --batch 16,64 --out /tmp/direct.json 2>&1 \
  | tee "$out/h200-speed-batch$tag.txt"
python3 -m bench.lone_stream --model $m --tokens 128 --runs 3 2>&1 | tee "$out/h200-speed-lone$tag.txt"
if [ -n "${PROFILE:-}" ]; then
  python3 -m bench.step_profile --model $m --clients 1,16,64 --rounds 3 --profile 2>&1 | tee "$out/h200-speed-steps$tag.txt"
  echo "== MLX_USE_CUDA_GRAPHS=0" | tee -a "$out/h200-speed-steps$tag.txt"
  MLX_USE_CUDA_GRAPHS=0 python3 -m bench.step_profile --model $m --clients 64 2>&1 | tee -a "$out/h200-speed-steps$tag.txt"
fi
grep -h "memory:\|warm-up" /tmp/logs/mlx-serve.log >> "$out/h200-speed-serve$tag${suffix:-}.txt"

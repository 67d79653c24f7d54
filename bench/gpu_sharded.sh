#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: issue 16's "what one GPU can show" for sharded
# serving. Two ranks over MLX's ring backend on loopback, both on the one GPU, against one
# plain process, on the 1B llama shape (bf16). Carry build/smollm2-tok (bench.make_model
# --tokenizer-only). Outputs under $OUT.
#   bash bench/gpu_sharded.sh
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -m bench.make_model --shape 1b --out /tmp/llama-1b --tokenizer-from build/smollm2-tok > /dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/h200-sharded-1gpu.txt"
# Each rank plans its KV memory from what the GPU has: both share one GPU, so each gets a budget.
timeout "${BENCH_S:-200}" python3 -m bench.sharded --model /tmp/llama-1b --modes "${MODES:-single,tensor,pipeline}" \
  --concurrency 1,16 --max-tokens 64 --launcher env --startup-timeout 120 \
  --mlx-serve-args="--memory-budget 30G ${SERVE_ARGS:-}" --log-dir /tmp/logs-sharded 2>&1 | tee -a "$out/h200-sharded-1gpu.txt"
for f in /tmp/logs-sharded/*.log; do
  echo "== $f" >> "$out/h200-sharded-1gpu-logs.txt"; tail -n 40 "$f" >> "$out/h200-sharded-1gpu-logs.txt"
done

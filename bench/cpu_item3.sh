#!/usr/bin/env bash
# Issue 19 item 3 on a CPU: a fresh server's first 16-client burst against the same burst warmed.
# MLX's CPU backend builds its fused kernels (mx.compile'd functions: SiLU, masks, sampling
# arithmetic) with the system C++ compiler the first time a process meets each one, and keeps the
# built libraries under $TMPDIR/mlx/<version>/cpu; a fresh machine (CI, a new box) has none.
# Three bursts, each from a freshly started server (bench's own warm-up off for the first two):
#   cold    an empty kernel folder
#   disk    the folder the cold run left
#   warmed  the same folder, and the bench warms the level (16 short requests) before timing
# Each with the server's --trace (TTFT parts) and bench/step_trace (every step's wall time; steps
# over 250 ms listed with their joining rows, to tell a long prefill from a stall).
#   MODEL=<folder> [PYTHON=.venv/bin/python] [OUT=/tmp/item3] [TOKENS=128] [ARGS='mlx-serve flags'] bash bench/cpu_item3.sh
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
py=${PYTHON:-python}
m=${MODEL:?MODEL=<model folder>}; out=${OUT:-/tmp/item3}; mkdir -p "$out"
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
if [ -e $blas ]; then export LD_PRELOAD=$blas MLX_SERVE_BLAS_CHOSEN=1; fi
kernels=$(mktemp -d)
burst() {  # name, extra serve_compare flags
  rm -rf "$out/steps-$1" "$out/$1.jsonl"
  "$py" -m bench.serve_compare --model "$m" --servers mlx-serve --concurrency 16 \
    --requests-per-level 16 --max-tokens "${TOKENS:-128}" --direct-runs 0 $2 \
    --env TMPDIR="$kernels" --env STEP_TRACE_DIR="$out/steps-$1" \
    --env PYTHONPATH="$PWD/bench/step_trace:$PYTHONPATH" \
    --mlx-serve-args="--trace $out/$1.jsonl ${ARGS:-}" --log-dir "$out/logs-$1" 2>&1 \
    | grep -v "^\[transformers\]"
  "$py" -m bench.trace_summary "$out/$1.jsonl" --last 16
  "$py" -m bench.step_trace_report "$out/steps-$1" --min-steps 10 --slow-ms 250
  echo "kernels built so far: $(find "$kernels" -name '*.so' | wc -l)"
}
for run in cold disk warmed; do
  echo "== $run"
  burst $run "$([ $run = warmed ] || echo --no-warmup)"
done

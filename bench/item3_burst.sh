#!/usr/bin/env bash
# Issue 19 item 3: a fresh server's first 16-client burst against the same burst warmed, on a CPU
# or (after .gpu/b/install.sh) the H200. A new kernel's first use costs: MLX's CUDA backend
# compiles each kernel shape (NVRTC, kept in $MLX_PTX_CACHE_DIR); its CPU backend builds its fused
# kernels (mx.compile'd functions: SiLU, masks) with the system C++ compiler and keeps them under
# $TMPDIR/mlx/<version>/cpu. A fresh machine (CI, a new box) has neither. Three bursts, each from
# a freshly started server with its default warm-up (the bench's own off for the first two), both
# kernel folders pointed at one empty folder:
#   cold    the empty folder
#   disk    the folder the cold run left
#   warmed  the same folder, and the bench warms the level (16 short requests) before timing
# Each with the server's --trace (TTFT parts) and bench/step_trace (every step's wall time; steps
# over 250 ms listed with their joining rows, to tell a long prefill from a stall).
#   MODEL=<folder> [PYTHON=python3] [OUT=/tmp/item3] [TOKENS=128] [ARGS='mlx-serve flags'] bash bench/item3_burst.sh
#   (on the H200: MODEL=/tmp/llama-1b, made by bench.make_model as bench/gpu_contexts.sh does)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
py=${PYTHON:-python3}
m=${MODEL:?MODEL=<model folder>}; out=${OUT:-/tmp/item3}; mkdir -p "$out"
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
if [ -e $blas ]; then export LD_PRELOAD=$blas MLX_SERVE_BLAS_CHOSEN=1; fi
kernels=$(mktemp -d)
burst() {  # name, extra serve_compare flags
  rm -rf "$out/steps-$1" "$out/$1.jsonl"
  "$py" -m bench.serve_compare --model "$m" --servers mlx-serve --concurrency 16 \
    --requests-per-level 16 --max-tokens "${TOKENS:-128}" --direct-runs 0 $2 \
    --env TMPDIR="$kernels" --env MLX_PTX_CACHE_DIR="$kernels/ptx" --env STEP_TRACE_DIR="$out/steps-$1" \
    --env PYTHONPATH="$PWD/bench/step_trace:$PYTHONPATH" \
    --mlx-serve-args="--trace $out/$1.jsonl ${ARGS:-}" --log-dir "$out/logs-$1" 2>&1 \
    | grep -v "^\[transformers\]"
  "$py" -m bench.trace_summary "$out/$1.jsonl" --last 16
  "$py" -m bench.step_trace_report "$out/steps-$1" --min-steps 10 --slow-ms 250
  echo "kernels built so far: $(find "$kernels" -type f \( -name '*.so' -o -path '*ptx*' \) | wc -l)"
}
for run in cold disk warmed; do
  echo "== $run"
  burst $run "$([ $run = warmed ] || echo --no-warmup)"
done

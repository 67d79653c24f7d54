#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: the engine's steps timed phase by phase inside
# the running server (bench/step_trace) while bench.batched_rounds loads it, then again with the
# phases synchronized (each phase's accelerator time). Outputs under $OUT:
#   SHAPE=1b [LEVELS=16,64] [ROUNDS=2] [ARGS='mlx-serve flags'] [SYNC=1] bash bench/gpu_step_trace.sh
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape; mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
run() {  # $1: trace dir, $2: levels, $3: rounds, $4: STEP_TRACE_SYNC
  STEP_TRACE_DIR=$1 STEP_TRACE_SYNC=$4 PYTHONPATH=$PWD/bench/step_trace:$PYTHONPATH \
    python3 -m bench.batched_rounds --model $m --levels $2 --requests ${REQUESTS:-256} --rounds $3 \
    --mlx-serve-args "${ARGS:-}" 2>&1 | grep -v "^\[transformers\]"
  python3 -m bench.step_trace_report $1
}
run /tmp/trace-async ${LEVELS:-16,64} ${ROUNDS:-2} 0 | tee "$out/step-trace-$shape.txt"
[ "${SYNC:-1}" = 1 ] && run /tmp/trace-sync 64 1 1 | tee "$out/step-trace-$shape-sync.txt"

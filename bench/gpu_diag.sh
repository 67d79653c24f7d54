#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: the step trace of bench/gpu_step_trace.sh with the
# host's and the accelerator's state beside it (vmstat: CPU busy/steal each second; nvidia-smi:
# SM clock, power, utilization twice a second), and the raw per-step JSON lines, under $OUT.
#   SHAPE=8b [LEVELS=16] [ROUNDS=4] [REQUESTS=128] bash bench/gpu_diag.sh
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu \
  --format=csv -lms 500 > "$out/smi.csv" 2>&1 & smi=$!
vmstat -t 1 > "$out/vmstat.txt" 2>&1 & vm=$!
python3 -c "import time; print('monotonic', time.monotonic(), 'wall', time.time())" > "$out/clock.txt"
SYNC=0 LEVELS=${LEVELS:-16} ROUNDS=${ROUNDS:-4} REQUESTS=${REQUESTS:-128} bash bench/gpu_step_trace.sh
kill $smi $vm 2>/dev/null
cp /tmp/trace-async/*.jsonl "$out/" 2>/dev/null
python3 -c "import time; print('monotonic', time.monotonic(), 'wall', time.time())" >> "$out/clock.txt"

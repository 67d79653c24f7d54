#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: bench.process_probe on the 1B shape, twice (the
# main process loading its model first, then last).   [ROUNDS=12] [TOKENS=256]  (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; m=/tmp/llama-1b; mkdir -p "$out"
lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))" > "$out/host.txt" 2>&1
nvidia-smi --query-gpu=name,compute_mode,clocks.sm,clocks.max.sm,persistence_mode --format=csv >> "$out/host.txt" 2>&1
[ -d $m ] || python3 -m bench.make_model --shape 1b --out $m --tokenizer-from build/smollm2-tok > /dev/null
for load in first last; do
  arms="main,spawn,spawn 2,popen,main thread"; [ $load = last ] && arms="main,spawn"
  python3 -m bench.process_probe --model $m --tokens ${TOKENS:-256} --rounds ${ROUNDS:-12} --arms "$arms" \
    --main-load $load --verbose 2>&1 | grep --line-buffered -v "^\[transformers\]" | tee -a "$out/process-probe-1b.txt"
done

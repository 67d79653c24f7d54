#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: bench.placement (does the CPU a process runs on
# move one stream's decode?) on each shape in SHAPES. Outputs under $OUT:
#   [SHAPES="1b 8b"] [TOKENS=256] [ROUNDS=5] bash bench/gpu_placement.sh
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; mkdir -p "$out"
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|MHz"; nvidia-smi topo -m 2>/dev/null | head -4; } | tee "$out/host.txt"
for shape in ${SHAPES:-1b 8b}; do
  m=/tmp/llama-$shape
  [ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
  python3 -m bench.placement --model $m --tokens ${TOKENS:-256} --rounds ${ROUNDS:-5} 2>&1 \
    | grep --line-buffered -v "^\[transformers\]" | tee "$out/placement-$shape.txt"
done

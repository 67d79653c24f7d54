#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: bench.neighbour_probe on the 1B shape (a pinned
# decoding thread, its neighbours on every other CPU quiet, spinning or waking each other).
#   [PIN=5] [TOKENS=256] [ROUNDS=20] [NEIGHBOURS=0: all]   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; m=/tmp/llama-1b; mkdir -p "$out"
lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))" > "$out/host.txt" 2>&1
[ -d $m ] || python3 -m bench.make_model --shape 1b --out $m --tokenizer-from build/smollm2-tok > /dev/null
python3 -m bench.neighbour_probe --model $m --pin ${PIN:-5} --tokens ${TOKENS:-256} --rounds ${ROUNDS:-20} \
  --neighbours ${NEIGHBOURS:-0} 2>&1 | grep --line-buffered -v "^\[transformers\]" | tee -a "$out/neighbours-1b.txt"

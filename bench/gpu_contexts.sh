#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: bench.stream_contexts on each shape in SHAPES.
#   [SHAPES="1b 8b"] [TOKENS=256] [ROUNDS=5] [ARGS='mlx-serve flags'] [CONTEXTS='served process,...'] [REFERENCE='direct worker'] [PIN=CPU]  [PARENT=DIR: served parent's checkout]
#   bash bench/gpu_contexts.sh   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; mkdir -p "$out"
lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))" > "$out/host.txt" 2>&1
for shape in ${SHAPES:-1b 8b}; do
  m=/tmp/llama-$shape
  [ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
  python3 -m bench.stream_contexts --model $m --tokens ${TOKENS:-256} --rounds ${ROUNDS:-5} --mlx-serve-args "${ARGS:-}" \
    ${CONTEXTS:+--contexts "$CONTEXTS"} ${REFERENCE:+--reference "$REFERENCE"} ${PIN:+--pin $PIN} ${PARENT:+--parent-tree "$PARENT"} 2>&1 \
    | grep --line-buffered -v "^\[transformers\]" | tee -a "$out/contexts-$shape.txt"
done

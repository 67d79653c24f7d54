#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: one stream on batch caches vs plain caches
# (bench.lone_cache), then single_stream (direct, in process with and without engine.rows.lone_row, HTTP).
#   SHAPES="1b 8b" [ROUNDS=5] [SERVERS=mlx-serve] bash bench/gpu_lone.sh   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; mkdir -p "$out"
for shape in ${SHAPES:-1b}; do
  m=/tmp/llama-$shape
  [ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
  python3 -m bench.lone_cache --model $m --tokens 256 --rounds ${ROUNDS:-5} 2>&1 | grep -v "^\[transformers\]" \
    | tee "$out/h200-lone-$shape.txt"
  python3 -m bench.single_stream --model $m --tokens 128 --rounds ${ROUNDS:-5} --servers ${SERVERS:-mlx-serve} 2>&1 \
    | grep -v "^\[transformers\]" | tee -a "$out/h200-lone-$shape.txt"
done

#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: issue 19 items 1 and 2 interleaved round by round
# (the host drifts between minutes): batched serving against batch_generate on the same workload
# (bench.batched_rounds), then one stream against direct stream_generate (bench.single_stream).
#   SHAPE=1b|8b [ROUNDS=3] [SINGLE_ROUNDS=7] bash bench/gpu_item12.sh   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape
mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
python3 -m bench.batched_rounds --model $m --levels 16,64 --requests 256 --rounds ${ROUNDS:-3} 2>&1 \
  | grep -v "^\[transformers\]" | tee "$out/h200-batched-rounds-$shape.txt"
python3 -m bench.single_stream --model $m --tokens 128 --rounds ${SINGLE_ROUNDS:-7} --servers mlx-serve,mlx_lm 2>&1 \
  | grep -v "^\[transformers\]" | tee "$out/h200-single-$shape.txt"

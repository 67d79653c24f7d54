#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: a change against its parent, interleaved round by
# round with batch_generate (bench.batched_rounds --baseline). The parent's server, engine,
# protocols and bench go in build/base beforehand:
#   rm -rf build/base && mkdir -p build/base && git archive REV server engine protocols bench | tar -x -C build/base
#   SHAPE=1b|8b [LEVELS=16,64] [REQUESTS=256] [ROUNDS=3] [ARGS='mlx-serve flags, both servers'] [BASELINE=0] bash bench/gpu_ab.sh
# (BASELINE=0: without the parent, ours against batch_generate only)
# (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape
mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
python3 -m bench.batched_rounds --model $m --levels ${LEVELS:-16,64} --requests ${REQUESTS:-256} \
  --rounds ${ROUNDS:-3} $([ "${BASELINE:-1}" = 0 ] || echo --baseline build/base) --mlx-serve-args "${ARGS:-}" 2>&1 \
  | grep --line-buffered -v "^\[transformers\]" | tee -a "$out/h200-ab-$shape.txt"

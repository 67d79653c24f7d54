#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: issue 19's items 1, 2, 4, 5, 6 in one run.
#   SHAPE=1b|8b [PARTS=single,serve,batch] [ROUNDS=5] [LEVELS=16,64] bash bench/gpu_item19.sh   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape
mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
parts=",${PARTS:-single,serve,batch},"
[[ $parts == *,single,* ]] && python3 -m bench.single_stream --model $m --tokens 128 --rounds ${ROUNDS:-5} --servers mlx-serve,mlx_lm 2>&1 \
  | grep -v "^\[transformers\]" | tee "$out/h200-single-$shape.txt"
[[ $parts == *,serve,* ]] || exit 0
python3 -m bench.serve_compare --model $m --servers mlx-serve,mlx_lm --concurrency ${LEVELS:-16,64} --direct-runs 0 \
  --mlx-serve-args="--trace /tmp/trace-$shape.jsonl" --log-dir /tmp/logs-$shape 2>&1 | tee "$out/h200-serve-$shape.txt"
python3 -m bench.trace_summary /tmp/trace-$shape.jsonl 2>&1 | tee -a "$out/h200-serve-$shape.txt"
[[ $parts == *,batch,* ]] || exit 0
python3 - > /tmp/prompts.json <<'PY'
import json
from pathlib import Path
from bench.prompts import PromptBook, load_tokenizer
book = PromptBook(None, load_tokenizer(Path("build/smollm2-tok")), False)
print(json.dumps([book.get(i).messages for i in range(64)]))
PY
python3 -m bench.direct --model $m --prompts /tmp/prompts.json --runs 3 --batch ${LEVELS:-16,64} --out /tmp/direct.json 2>&1 \
  | tee "$out/h200-batch-$shape.txt"
python3 -m bench.step_profile --model $m --clients ${LEVELS:-16,64} --rounds 3 2>&1 | tee -a "$out/h200-batch-$shape.txt"

#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: serving at 16 and 64 clients with MLX's kernel
# cache warmed first (a pass of ours that is not reported), then ours and mlx_lm.server side by
# side, and batch_generate at the same B, in one run.   SHAPE=1b bash bench/gpu_warm_serve.sh
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape
mkdir -p "$out"
export REQUESTS=${REQUESTS:-256}
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
python3 -m bench.serve_compare --model $m --servers mlx-serve --concurrency 16,64 --requests-per-level 64 --direct-runs 0 \
  --log-dir /tmp/warm-$shape > "$out/h200-warm-pass-$shape.txt" 2>&1
python3 -m bench.serve_compare --model $m --servers mlx-serve,mlx_lm --concurrency 16,64 --requests-per-level $REQUESTS \
  --direct-runs 0 --log-dir /tmp/logs-$shape 2>&1 | tee "$out/h200-serve-warm-$shape.txt"
python3 - > /tmp/prompts.json <<'PY'
import json, os
from pathlib import Path
from bench.prompts import PromptBook, load_tokenizer
book = PromptBook(None, load_tokenizer(Path("build/smollm2-tok")), False)
print(json.dumps([book.get(i).messages for i in range(int(os.environ["REQUESTS"]))]))
PY
# batch_generate at B=16 and 64: B prompts in one wave (decode rate), and the servers' whole
# workload (REQUESTS prompts, B at a time: joins and their prefill, as the servers' aggregate has)
python3 -m bench.direct --model $m --prompts /tmp/prompts.json --runs 3 --batch 16,64 --out /tmp/direct.json 2>&1 \
  | tee -a "$out/h200-serve-warm-$shape.txt"
python3 -m bench.direct --model $m --prompts /tmp/prompts.json --runs 3 --batch 16,64 --batch-requests $REQUESTS \
  --out /tmp/direct-all.json 2>&1 | tee -a "$out/h200-serve-warm-$shape.txt"

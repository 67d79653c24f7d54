#!/usr/bin/env bash
# One benchmark of the suite on an NVIDIA host, on a random-weight shape or a model folder.
#   bash bench/gpu.sh BENCH SHAPE [bench flags ...]
#   BENCH  serve | stream | agent | mixed | speculation | startup | loop   (python -m bench BENCH)
#   SHAPE  llama-1b | llama-8b  (Llama-3.2-1B / Llama-3.1-8B shapes, random bf16 weights, SmolLM2's
#          tokenizer and template, context 32k), or a model folder
# The host runs MLX's CUDA build with no network: first prepare it (docs/performance.md, "On a
# GPU"): here, write the tokenizer into the tree (python -m bench.make_model --tokenizer-only
# --out build/smollm2-tok) and the host's wheels into .gpu/; there, stage .gpu/a, then this
# script sources .gpu/b/install.sh when MLX is not importable yet. Writes $OUT/BENCH-GPU-SHAPE.txt
# and .json (OUT defaults to /tmp/out), e.g. serve-h100-llama8b.txt.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
bench=$1; shape=$2; shift 2
cd "$(dirname "$0")/.."
if ! python3 -c "import mlx.core" 2>/dev/null && [ -f .gpu/b/install.sh ]; then
  # shellcheck disable=SC1091
  source .gpu/b/install.sh
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-/tmp/out}
mkdir -p "$out"
case $shape in
  llama-1b|llama-8b)
    model=/tmp/bench-$shape
    if [ ! -f "$model/config.json" ]; then
      python3 -m bench.make_model --shape "${shape#llama-}" --out "$model" --context 32768 \
        --tokenizer-from "${TOKENIZER:-build/smollm2-tok}"
    fi
    ;;
  *) model=$shape ;;
esac
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'h100|h200|a100|l40s|gh200' | head -1 || true)
name="$bench-$(echo "${gpu:-gpu}" | tr 'A-Z' 'a-z')-$(basename "$model" | sed 's/^bench-//; s/[^A-Za-z0-9]//g' | tr 'A-Z' 'a-z')"
python3 -m bench "$bench" --model "$model" --json "$out/$name.json" "$@" 2>&1 | tee "$out/$name.txt"

#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: speculation benchmarks for README.
#   bash bench/gpu_speculation.sh smollm   # real SmolLM2 (GGUF parts staged in ~/gpu-stage)
#   bash bench/gpu_speculation.sh 1b       # random-weight Llama-3.2-1B shape, bf16
#   bash bench/gpu_speculation.sh load     # SmolLM2: step costs, aggregate under load, the gate
# EXTRA adds bench.speculation flags (e.g. EXTRA=--aggregate-only).
set -euo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
smollm_dir() {
  cat ~/gpu-stage/smol.aa ~/gpu-stage/smol.ab .gpu/b/smol.ac > /tmp/smol.gguf
  python3 -c "from pathlib import Path; from engine.gguf.convert import convert_gguf; print(convert_gguf(Path('/tmp/smol.gguf'), cache_root=Path('/tmp/cache')))"
}
case "$1" in
load)
  dir=$(smollm_dir)
  for shape in "16 256" "32 512" "4 256"; do
    set -- $shape
    python3 -m bench.step_cost --model "$dir" --rows "$1" --context "$2"
  done | tee "$out/h200-step-cost${TAG:-}.txt"
  python3 -m bench.speculation --model "$dir" --tokens 128 --clients 4,16 --aggregate-only --agg-runs 5 \
    --modes ngram,ngram-forced,predict,predict-edited ${EXTRA:-} | tee "$out/h200-speculation-load${TAG:-}.txt"
  python3 -m bench.gate_probe --model "$dir" --clients 16 --rounds 3 | tee "$out/h200-gate-probe${TAG:-}.txt"
  ;;
smollm)
  dir=$(smollm_dir)
  python3 -m bench.speculation --model "$dir" --draft-layers 0,1,2,3,4,5,6,7,8,9,10,11,12,17,18,19,20,21,22,23,24,25,26,27,28,29 \
    --tokens 128 --gammas 1,2,3,4,5 --clients 1,4,16 --runs 3 ${EXTRA:-} | tee "$out/h200-speculation-smollm2${TAG:-}.txt"
  ;;
1b)
  python3 -m bench.make_model --shape 1b --out /tmp/llama-1b --tokenizer-from build/smollm2-tok
  python3 -m bench.speculation --model /tmp/llama-1b --draft-layers 0,1,2,3 \
    --tokens 128 --gammas 1,2,3,4,5 --clients 1,4,16 --runs 3 ${EXTRA:-} | tee "$out/h200-speculation-1b${TAG:-}.txt"
  ;;
esac

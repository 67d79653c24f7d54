#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: issue 19 item 5, launch -> first answer on the
# 1B shape, mlx-serve (with and without its warm-up) and mlx_lm.server in turns, ROUNDS each,
# plus what the pieces cost (imports; the engine's own log lines with their clock).
#   [ROUNDS=3] [NOWARM=0] bash bench/gpu_startup.sh   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape; r=${ROUNDS:-3}
mkdir -p "$out"; f="$out/h200-startup-$shape.txt"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
for mod in mlx.core mlx_lm transformers server.cli "engine, mlx_lm"; do  # engine: torch kept out
  python3 -c "import time; t=time.perf_counter(); import $mod; print(f'import $mod: {time.perf_counter()-t:.2f} s')" 2>&1 | tail -1 | tee -a "$f"
done
python3 -c "import importlib.util as u; print('torch installed:', u.find_spec('torch') is not None)" | tee -a "$f"
python3 -X importtime -c "import mlx_lm" 2> /tmp/imp.txt; sort -t'|' -k2 -n /tmp/imp.txt | tail -25 > "$out/h200-import-mlx_lm.txt"
python3 -X importtime -c "import engine, mlx_lm" 2> /tmp/imp.txt; sort -t'|' -k2 -n /tmp/imp.txt | tail -25 > "$out/h200-import-engine-mlx_lm.txt"
for i in $(seq 1 "$r"); do
  echo "-- round $i: mlx-serve" | tee -a "$f"
  SERVER="python3 -m server" LOG=/tmp/ours.log bash bench/startup.sh 1 --model $m 2>&1 | tee -a "$f"
  grep -E "mlx-serve|loaded|warm-up|rows decoded|BLAS" /tmp/ours.log | cut -c1-200 | tee -a "$f"
  if [ "${NOWARM:-1}" = 1 ]; then  # NOWARM=0 leaves this variant out
    echo "-- round $i: mlx-serve --no-warmup" | tee -a "$f"
    SERVER="python3 -m server" LOG=/tmp/ours-nw.log bash bench/startup.sh 1 --model $m --no-warmup 2>&1 | tee -a "$f"
  fi
  echo "-- round $i: mlx_lm.server" | tee -a "$f"
  SERVER="python3 -m mlx_lm server" LOG=/tmp/theirs.log bash bench/startup.sh 1 --model $m 2>&1 | tee -a "$f"
done
cp /tmp/ours.log "$out/h200-startup-ours-last.log"

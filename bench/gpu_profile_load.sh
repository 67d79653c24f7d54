#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh, with py-spy's wheel in .whl/: where the engine
# process spends its time under the bench's own closed-loop load (C clients over several client
# processes, as bench.serve_compare measures it): py-spy records the engine process and the server
# process for SECONDS once C rows are running.
#   SHAPE=1b [CLIENTS=64] [SECONDS=10] [NATIVE=1] bash bench/gpu_profile_load.sh   (outputs under $OUT)
# NATIVE=1 records the engine process's native frames too (MLX's C++ and the CUDA libraries under
# the Python ones), at 100 Hz and pausing it for each sample, so its timing is disturbed a little.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape; c=${CLIENTS:-64}; mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
python3 -m bench.serve_compare --model $m --servers mlx-serve --concurrency $c --requests-per-level $((c * 16)) \
  --direct-runs 0 --log-dir /tmp/prof-logs > /tmp/prof-load.txt 2>&1 &
load=$!
until port=$(grep -o -- '--port [0-9]*' /tmp/prof-load.txt | head -1 | cut -d' ' -f2) && [ -n "$port" ]; do sleep 0.5; done
# the measured level (after its warm-up pass): C rows running, then 3 s more
until python3 -c "import httpx,sys; s=httpx.get('http://127.0.0.1:$port/stats',timeout=2).json(); sys.exit(s.get('requests_finished',0) < 2*$c)" 2>/dev/null; do sleep 0.5; done
sleep 3
server=$(pgrep -f "server --model $m" | head -1)
child=$(pgrep -P $server -f spawn_main | head -1)
how="--rate 400 --nonblocking"; [ "${NATIVE:-0}" = 1 ] && how="--rate 100 --native"
/tmp/spy/bin/py-spy record --pid $child --duration ${SECONDS:-10} $how --idle --threads --format raw \
  -o "$out/spy-load-engine-$shape-c$c.txt" > /dev/null 2>&1 &
/tmp/spy/bin/py-spy record --pid $server --duration ${SECONDS:-10} --rate 400 --idle --threads --nonblocking --format raw \
  -o "$out/spy-load-server-$shape-c$c.txt" > /dev/null 2>&1
wait $load
grep -E "C=|mlx-serve  " /tmp/prof-load.txt | tee "$out/prof-load-$shape-c$c.txt"

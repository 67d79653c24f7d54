#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh, with py-spy's wheel in .whl/: where the engine
# process and the server process spend one stream's time (py-spy, collapsed stacks, by thread,
# idle included) while a client streams greedy chat completions back to back.
#   SHAPE=1b [CLIENTS=1] [SECONDS=15] bash bench/gpu_profile.sh   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape; mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl
python3 -m server --model $m --port 8090 ${ARGS:-} > /tmp/serve-$shape.log 2>&1 &
server=$!
until curl -sf localhost:8090/health > /dev/null; do sleep 1; done
python3 - <<'PY' &
import asyncio, os, time, httpx
N, T = int(os.environ.get("CLIENTS", "1")), float(os.environ.get("SECONDS", "15")) + 12
body = {"model": "default_model", "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 256,
        "temperature": 0, "stream": True}
async def client(c):
    end, n = time.time() + T, 0
    while time.time() < end:
        async with c.stream("POST", "http://127.0.0.1:8090/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for _ in r.aiter_lines():
                n += 1
    return n
async def main():
    async with httpx.AsyncClient(timeout=600) as c:
        print("lines", sum(await asyncio.gather(*(client(c) for _ in range(N)))))
asyncio.run(main())
PY
load=$!
sleep 10
child=$(pgrep -f spawn_main | head -1)
/tmp/spy/bin/py-spy record --pid $child --duration ${SECONDS:-15} --rate 400 --idle --threads --nonblocking --format raw \
  -o "$out/spy-engine-$shape-c${CLIENTS:-1}.txt" > /dev/null 2>&1 &
/tmp/spy/bin/py-spy record --pid $server --duration ${SECONDS:-15} --rate 400 --idle --threads --nonblocking --format raw \
  -o "$out/spy-server-$shape-c${CLIENTS:-1}.txt" > /dev/null 2>&1
wait $load
kill $server; wait
tail -5 /tmp/serve-$shape.log

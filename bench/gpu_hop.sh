#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: one stream's decode as the engine made it (its
# --trace clock: first token to finish) against as the client received it (first chunk to last),
# request by request, for N sequential streaming requests; then direct stream_generate.
#   SHAPE=1b [N=6] [TOKENS=256] bash bench/gpu_hop.sh   (outputs under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape; mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
rm -f /tmp/hop.jsonl
python3 -m server --model $m --port 8091 --trace /tmp/hop.jsonl ${ARGS:-} > /tmp/hop-$shape.log 2>&1 &
server=$!
until curl -sf localhost:8091/health > /dev/null; do sleep 1; done
M=$m python3 - <<'PY' 2>&1 | grep -v "^\[transformers\]" | tee "$out/hop-$shape.txt"
import os, time, httpx, orjson
N, T = int(os.environ.get("N", "6")), int(os.environ.get("TOKENS", "256"))
body = {"model": "default_model", "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": T, "temperature": 0, "stream": True}
spans = []
with httpx.Client(timeout=600) as c:
    for i in range(N + 2):
        times = []
        with c.stream("POST", "http://127.0.0.1:8091/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    times.append(time.perf_counter())
        if i >= 2:
            spans.append((len(times), times[-1] - times[0]))
time.sleep(1)
lines = [orjson.loads(l) for l in open("/tmp/hop.jsonl")][-N:]
for (n, span), line in zip(spans, lines):
    e = line["engine_s"][0]
    eng = e["finished"] - e["first_token"]
    print(f"client chunks {n} first->last {span*1000:7.1f} ms ({(n-1)/span:6.1f}/s)   engine first token->finish {eng*1000:7.1f} ms ({T/eng:6.1f} tok/s)")
from mlx_lm import load
from mlx_lm.generate import stream_generate
model, tok = load(os.environ["M"])
prompt = tok.apply_chat_template(body["messages"], add_generation_prompt=True)
for i in range(4):
    ts = [time.perf_counter() for _ in stream_generate(model, tok, prompt, max_tokens=T)]
    if i: print(f"direct stream_generate first->last {(ts[-1]-ts[0])*1000:7.1f} ms ({(len(ts)-1)/(ts[-1]-ts[0]):6.1f} tok/s)")
PY
kill $server; wait

#!/usr/bin/env bash
# On the borrowed H200, after .gpu/b/install.sh: one stream's decode as the engine made it (its
# --trace clock: first token to finish) against as the client received it (first chunk to last),
# request by request, for N sequential streaming requests; then direct stream_generate.
#   SHAPE=1b [N=6] [TOKENS=256] [LANES=1] [STEP_TRACE=1] [SPY=1] bash bench/gpu_hop.sh   (outputs under $OUT)
# LANES=1 first runs bench.engine_lanes (direct / scheduler + runner / the whole core, in process);
# STEP_TRACE=1 times the served engine's steps phase by phase (bench/step_trace); SPY=1 then
# records the engine process with py-spy (wheel in .whl/) over N more requests.
set -uo pipefail
export PYTHONPATH=$PWD:${PYTHONPATH:-}
out=${OUT:-/tmp/out}; shape=${SHAPE:-1b}; m=/tmp/llama-$shape; mkdir -p "$out"
[ -d $m ] || python3 -m bench.make_model --shape $shape --out $m --tokenizer-from build/smollm2-tok > /dev/null
if [ "${LANES:-0}" = 1 ]; then
  python3 -m bench.engine_lanes --model $m --tokens ${TOKENS:-256} --rounds ${ROUNDS:-5} 2>&1 \
    | grep --line-buffered -v "^\[transformers\]" | tee "$out/lanes-$shape.txt"
fi
[ "${SPY:-0}" = 1 ] && { [ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/py_spy*.whl; }
rm -rf /tmp/hop.jsonl /tmp/hop-steps
trace=""; [ "${STEP_TRACE:-0}" = 1 ] && trace="$PWD/bench/step_trace:"
STEP_TRACE_DIR=/tmp/hop-steps PYTHONPATH=$trace$PYTHONPATH \
  python3 -m server --model $m --port 8091 --trace /tmp/hop.jsonl ${ARGS:-} > /tmp/hop-$shape.log 2>&1 &
server=$!
until curl -sf localhost:8091/health > /dev/null; do sleep 1; done
M=$m OUTF="$out/spy-single-engine-$shape.txt" SERVER=$server python3 - <<'PY' 2>&1 | grep -v "^\[transformers\]" | tee "$out/hop-$shape.txt"
import os, subprocess, time, httpx, orjson
N, T = int(os.environ.get("N", "6")), int(os.environ.get("TOKENS", "256"))
body = {"model": "default_model", "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": T, "temperature": 0, "stream": True}
def one(c):
    times = []
    with c.stream("POST", "http://127.0.0.1:8091/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                times.append(time.perf_counter())
    return len(times), times[-1] - times[0]
spans = []
with httpx.Client(timeout=600) as c:
    for i in range(N + 2):
        span = one(c)
        if i >= 2:
            spans.append(span)
    if os.environ.get("SPY") == "1":
        child = subprocess.run(["pgrep", "-P", os.environ["SERVER"], "-f", "spawn_main"],
                               capture_output=True, text=True).stdout.split()[0]
        spy = subprocess.Popen(["/tmp/spy/bin/py-spy", "record", "--pid", child, "--rate", "1000", "--idle",
                                "--threads", "--nonblocking", "--format", "raw", "-o", os.environ["OUTF"],
                                "--duration", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
        spied = [one(c) for _ in range(N)]
        spy.send_signal(2)
        spy.wait()
        print("under py-spy:", " ".join(f"{(n - 1) / s:.1f}/s" for n, s in spied))
time.sleep(1)
lines = [orjson.loads(l) for l in open("/tmp/hop.jsonl")][2:N + 2]
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
[ "${STEP_TRACE:-0}" = 1 ] && python3 -m bench.step_trace_report /tmp/hop-steps --min-steps 50 | tee "$out/hop-steps-$shape.txt"
true

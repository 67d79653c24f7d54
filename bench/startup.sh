#!/usr/bin/env bash
# Launch -> first answer: start mlx-serve, send a one-token chat request every 50 ms until one
# answers 200, stop it; N times.   bash bench/startup.sh [N] [mlx-serve flags ...]
# (no flags: the default model, which must have been fetched and converted once before)
# SERVER="python3 -m mlx_lm server" times another server the same way; its log goes to $LOG.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-5}; shift || true
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
body='{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
for i in $(seq 1 "$n"); do
  t0=$(date +%s.%N)
  ${SERVER:-.venv/bin/mlx-serve} --port "$port" "$@" > "${LOG:-/tmp/mlx-serve-startup.log}" 2>&1 &
  pid=$!
  until [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' -d "$body" \
             "127.0.0.1:$port/v1/chat/completions" 2>/dev/null)" = 200 ]; do
    kill -0 $pid 2>/dev/null || { echo "mlx-serve exited:"; tail -5 "${LOG:-/tmp/mlx-serve-startup.log}"; exit 1; }
    sleep 0.05
  done
  t1=$(date +%s.%N)
  printf 'start %d: launch -> first answer %.2f s\n' "$i" "$(python3 -c "print($t1 - $t0)")"
  kill $pid; wait $pid 2>/dev/null
done

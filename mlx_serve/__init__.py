"""mlx-serve: an LLM inference server for MLX, OpenAI-, Anthropic- and Ollama-compatible.

Installed as one namespace: mlx_serve.server (the ASGI app, CLI), mlx_serve.protocols (one
module per wire format) and mlx_serve.engine (everything that touches MLX)."""

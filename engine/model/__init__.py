"""The model room: what is loaded and what is known about it before a row runs.

Owns loading (folders, GGUF through engine.gguf, package shortcuts, dequantized copies), the
tokenizer and chat templates, the device and BLAS choice, the MLX names the rest of the engine
uses (mlx_boundary), and the memory facts (weights, KV per token, the machine's budget).

May import: engine's vocabulary (types, errors), engine.gguf. Nothing above it.
"""

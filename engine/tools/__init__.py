"""The tools room: tool calls in generated text — the markup families (JSON and XML shapes,
mlx-lm's parsers), the streaming splitter that holds back a call until it is whole.

May import: engine's vocabulary, engine.text. Nothing above it.
"""

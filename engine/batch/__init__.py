"""The batch room: the continuous batch — admission, the scheduler (pure Python, no MLX), the
core that drives schedule() -> run() -> update(), the runner that executes a plan on MLX, rows'
prompts and text, and the prefix cache.

May import: engine's vocabulary, engine.model, engine.text, engine.tools, engine.rows,
engine.speculation. Never engine.host (which builds and hosts it).
"""

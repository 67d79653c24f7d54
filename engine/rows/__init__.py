"""The rows room: one row's pieces inside a batched forward — its KV padding, the single-row
path, prefill of joining rows, its sampler, its grammar matcher, the fence that keeps a fault
its own — and the records a step passes around (plan, output, token updates).

May import: engine's vocabulary, engine.model. Nothing above it (not the scheduler, the core
or speculation, which build on it).
"""

"""The GGUF room: reading GGUF files (header, tensors, vocabulary and tokenizer) and converting
one into an mlx-lm model folder.

May import: nothing of the engine; engine.model's loader uses it.
"""

"""The encoder room: embedding models, which read a whole input at once and keep no KV.

Owns the encoder networks (BERT as sentence-transformers ships it, nomic-bert from GGUF), finding
and loading them (package shortcuts, folders, GGUF), tokenizing their inputs, planning forwards
over inputs that arrived together (batching by arrival), and pooling hidden states into vectors
(mean pooling, L2 normalisation, Matryoshka truncation).

May import: engine's vocabulary (types, errors), engine.gguf, engine.model. Nothing above it;
the host room runs it for the server (engine.host.encoder).
"""

"""The speculation room: speculative decoding inside the continuous batch — drafters (a draft
model, prompt-lookup n-grams), the gate that turns it off where it does not pay, verification
of every row's drafts in one target forward, and the KV cache that trims rejected positions.

May import: engine's vocabulary, engine.model, engine.rows. Never engine.batch or engine.host.
"""

from __future__ import annotations

# engine.speculation.cut_cache compacts a batch once a row holds this many cut positions
# (engine.batch.admission charges memory for them).
MIN_HOLES_TO_COMPACT = 32

"""The text room: rules over generated text that every row applies — stop strings and the
split of a reasoning block from the answer.

May import: engine's vocabulary (types, errors). Nothing above it.
"""

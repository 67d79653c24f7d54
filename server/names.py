"""Which model names a request may use, and what /v1/models lists.

A request may name the model by its id (what /v1/models lists), by the `--model` argument as
given, by any `--served-model-name` alias (globs allowed: `claude-*` serves every Claude model
name a client hard-codes), or not at all. Any other name is a 404 `model_not_found` in the
route's own envelope: a client pointed at the wrong server finds out at once. The answer echoes
the name the request used.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class ServedNames:
    model_id: str
    model_arg: str | None = None
    aliases: Sequence[str] = ()

    @property
    def listed(self) -> list[str]:
        """The names /v1/models lists: the id, then each alias that is not a pattern."""
        names = [self.model_id] + [a for a in self.aliases if not GLOB_CHARS & set(a)]
        return list(dict.fromkeys(names))

    def accepts(self, name: str | None) -> bool:
        if not name or name in ("default", "default_model"):
            return True
        exact = {self.model_id, *self.aliases}
        if self.model_arg:
            exact |= {self.model_arg, Path(self.model_arg).name, str(Path(self.model_arg).expanduser())}
        if name in exact:
            return True
        return any(fnmatch.fnmatchcase(name, a) for a in self.aliases if GLOB_CHARS & set(a))

    def refusal(self, name: str) -> str:
        return (
            f"model '{name}' is not served here; use one of: {', '.join(self.listed)} "
            "(or start the server with --served-model-name to add an alias)"
        )

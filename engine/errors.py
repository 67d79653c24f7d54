"""Typed engine failures. Each wire format maps these to its own status and body in one place;
the HTTP-only ones (404, 405, 413, 401, a client that left) live in protocols.contract."""

from __future__ import annotations


class ServeError(Exception):
    """Base of every error a client can be told about."""

    status: int = 500

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(ServeError):
    status = 400


class ContextTooLong(InvalidRequest):
    """The prompt alone does not fit the model's context."""


class QueueFull(ServeError):
    status = 429

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineUnavailable(ServeError):
    """The engine is loading, restarting or dead: try again later."""

    status = 503


class EngineFailed(ServeError):
    """The engine broke while serving this request."""

    status = 500


def grammar_message(message: object) -> str:
    """llguidance's complaint without its parser-state dump or a Rust panic's backtrace, and
    short enough for one line of an error body or a log."""
    text = str(message or "the grammar failed")
    for cut in ("<state>", "<backtrace>", "stack backtrace:", "note: run with"):
        text = text.split(cut, 1)[0]
    text = " ".join(text.split())
    if text == "NoExtensionBias":
        text = "no text can match it"
    return text if len(text) <= MAX_GRAMMAR_MESSAGE else text[: MAX_GRAMMAR_MESSAGE - 3] + "..."


MAX_GRAMMAR_MESSAGE = 300

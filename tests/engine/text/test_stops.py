from __future__ import annotations

from mlx_serve.engine.text.stops import StopMatcher


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, str | None]:
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces) + m.flush()
    return out, m.matched


def test_stop_matcher_passes_text_without_stops() -> None:
    assert run((), ["a", "b"]) == ("ab", None)


def test_stop_matcher_cuts_at_stop_inside_one_piece() -> None:
    assert run(("END",), ["hello END tail"]) == ("hello ", "END")


def test_stop_matcher_matches_across_every_split() -> None:
    text = "one two STOP three"
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert run(("STOP",), [text[:i], text[i:j], text[j:]]) == ("one two ", "STOP")


def test_stop_matcher_never_leaks_a_partial_stop_then_releases_it() -> None:
    m = StopMatcher(("</end>",))
    assert m.feed("abc</e") == "abc"
    assert m.feed("x") == "</ex"
    assert m.flush() == ""


def test_stop_matcher_releases_held_text_at_end() -> None:
    assert run(("STOP",), ["abc ST"]) == ("abc ST", None)


def test_stop_matcher_earliest_of_several_stops_wins() -> None:
    assert run(("zz", "b"), ["a", "bzz"]) == ("a", "b")


def test_stop_matcher_ignores_text_after_match() -> None:
    m = StopMatcher(("x",))
    assert m.feed("ax") == "a"
    assert m.feed("more") == ""
    assert m.flush() == ""

"""The streaming JSON check that decides which argument text is safe to pass on."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from mlx_serve.engine.tools.json_scan import JsonScanner, partial_value

VALID = [
    "{}",
    "[]",
    '{"a": 1}',
    '{"a": [1, -0, 2.5, -1.5e-3, 1E+2, 0.0], "b": {"c": null}}',
    '"plain"',
    r'"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00"',
    "[true, false, null]",
    '{ "spaced" :\n\t[ 1 , 2 ] }',
    '[[[[]]], {"": ""}]',
    '"\u00e9t\u00e9 \u2014 \U0001f600"',
]
INVALID = [
    '{"a" 1}',
    '{"a": 1,}',
    "[1,]",
    "{,}",
    "01",
    "1.",
    ".5",
    "-",
    "1.e5",
    "tru",
    "nul",
    '"\\x"',
    '"\\u12g4"',
    '{"a": 1}}',
    "[1 2]",
    "{1: 2}",
    "{'a': 1}",
    "+1",
    "[}",
    "{]",
]


def scan(pieces: list[str]) -> tuple[JsonScanner, str, int]:
    scanner, out, used = JsonScanner(), [], 0
    for piece in pieces:
        n, accepted = scanner.feed(piece)
        out.append(accepted)
        used += n
        if scanner.done or scanner.error:
            break
    return scanner, "".join(out), used


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.choice([0, -7, 12345, 2.5, -1e-9, 6.02e23])
    if kind in (2, 3):
        return "".join(rng.choice('ab "\\/\n\t\u00e9\u2014\U0001f600{}[],:') for _ in range(rng.randrange(6)))
    if kind in (4, 5):
        return {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randrange(4))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


@pytest.mark.parametrize("text", VALID)
def test_json_scan_accepts_valid_json_whole_and_char_by_char(text: str) -> None:
    for pieces in ([text], list(text)):
        scanner, out, used = scan(pieces)
        assert scanner.done and out == text and used == len(text)
        assert json.loads(out) == json.loads(text)


@pytest.mark.parametrize("text", INVALID)
def test_json_scan_stops_at_what_is_not_json(text: str) -> None:
    for pieces in ([text], list(text)):
        scanner, _, used = scan(pieces)
        assert not (scanner.done and used == len(text)), "took broken JSON for a whole value"


def test_json_scan_random_documents_in_random_pieces() -> None:
    rng = random.Random(7)
    for _ in range(300):
        value = {"args": random_value(rng)}
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randrange(1, 12))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        scanner, out, _ = scan(pieces)
        assert scanner.done and out == text and json.loads(out) == value


def test_json_scan_every_accepted_prefix_of_a_broken_document_is_a_json_prefix() -> None:
    text = '{"city": "Paris", "days": [1, 2], "ok": true} trailing'
    scanner, out, used = scan(list(text))
    assert scanner.done and out == text[:used] == '{"city": "Paris", "days": [1, 2], "ok": true}'


def test_json_scan_escapes_raw_control_characters_inside_strings() -> None:
    scanner, out, _ = scan(['{"code": "a\n\tb"}'])
    assert scanner.done and out == '{"code": "a\\n\\tb"}' and json.loads(out) == {"code": "a\n\tb"}


def test_json_scan_a_number_ends_only_when_something_follows_it() -> None:
    scanner = JsonScanner()
    assert scanner.feed("[12") == (3, "[12") and not scanner.done
    assert scanner.feed("]") == (1, "]") and scanner.done


@pytest.mark.parametrize(
    ("cut", "holds"),
    [
        ('{"city": "Par', {}),
        ('{"city": "Paris", "da', {"city": "Paris"}),
        ('{"city": "Paris", "days": 3', {"city": "Paris", "days": 3}),
        ('{"a": [1, {"b": tr', {"a": [1, {}]}),
        ('{"x": 1.', {}),
        ('{"a": 1} and more', {"a": 1}),
        ("", None),
        ("not json", None),
    ],
)
def test_json_scan_partial_value_reads_a_cut_text_as_the_sdks_do(cut: str, holds: Any) -> None:
    assert partial_value(cut) == holds

"""Tier 3: mlx-serve replicas behind the shipped replicas site (deploy/nginx/mlx-serve-replicas.conf).

Real replicas of the default model on loopback behind a real nginx (Debian's, installed when
missing): requests without a session header spread by least connections; an `X-Session-Id`
header pins a conversation to one replica, whose prefix cache then holds its earlier turns; a
429 from a full replica, and a replica that dies before answering, are retried on another one;
a stream whose replica dies after its first byte is cut, never replayed elsewhere. Which replica
served what is read from each replica's own /stats counters and from nginx's upstream log.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.tools import (
    REPLICAS_SITE,
    Nginx,
    content_frames,
    kill_replica,
    tokens_settle,
    trusting,
    wait_for_stats,
)
from tests.support.server_proc import ServerProcess, free_port

# One batch row and two waiting places: with three requests in, the fourth is refused with 429.
# (Not one waiting place: mlx-serve's scheduler then refuses the second of two requests that reach
# an idle engine in the same step, in-band after its 200 headers, where no proxy can retry it.)
SMALL = ("--decode-concurrency", "1", "--max-queue", "2")
SMALL_WAITING = 2
STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]
LONG = 1000  # max_tokens of a stream that outlives the test's interest in it
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"  # the crash's queued request: its own path in nginx's log


def start_replicas(model: Path, folder: Path, *flags: Sequence[str]) -> list[ServerProcess]:
    """One replica per flag set, started side by side; if one fails, the others are stopped."""
    with ThreadPoolExecutor(len(flags)) as pool:
        futures = [
            pool.submit(ServerProcess, ["--model", str(model), *f], folder / f"replica{i}.log")
            for i, f in enumerate(flags)
        ]
    up = [f.result() for f in futures if f.exception() is None]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        for server in up:
            server.close()
        raise errors[0]
    return up


@dataclass
class Pool:
    replicas: list[ServerProcess]
    nginx: Nginx


@pytest.fixture(scope="module")
def pool(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A small replica (one row, two waiting places) and a roomy one (the defaults) behind nginx."""
    folder = tmp_path_factory.mktemp("replicas")
    replicas = start_replicas(smollm_path, folder, SMALL, ())
    try:
        nginx = Nginx([r.port for r in replicas], folder, site=REPLICAS_SITE).start()
        yield Pool(replicas, nginx)
        nginx.stop()
    finally:
        for r in replicas:
            r.close()


# -- asking through nginx, and seeing who answered -----------------------------------------


def client(nginx: Nginx, read_s: float = 120) -> httpx.Client:
    return httpx.Client(http2=True, verify=trusting(nginx.cert), timeout=httpx.Timeout(30, read=read_s))


def session_header(session: str | None) -> dict[str, str]:
    return {"x-session-id": session} if session else {}


def post(
    c: httpx.Client,
    nginx: Nginx,
    messages: list[dict[str, str]],
    session: str | None = None,
    max_tokens: int = 2,
) -> httpx.Response:
    body = {"messages": messages, "max_tokens": max_tokens}
    return c.post(nginx.url + CHAT, json=body, headers=session_header(session))


def ok(r: httpx.Response) -> dict[str, Any]:
    """The JSON of a 200."""
    assert r.status_code == 200, r.text
    return dict(r.json())


def stream_to_end(c: httpx.Client, nginx: Nginx, text: str, session: str | None = None) -> bytes:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8, "stream": True}
    with c.stream("POST", nginx.url + CHAT, json=body, headers=session_header(session)) as r:
        assert r.status_code == 200, r.read()
        raw = b"".join(r.iter_bytes())
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-300:]
    assert b'data: {"error"' not in raw, raw[-500:]
    return raw


def started(replicas: Sequence[ServerProcess]) -> list[int]:
    """Each replica's requests_started counter."""
    return [int(str(r.stats()["requests_started"])) for r in replicas]


def since(replicas: Sequence[ServerProcess], before: list[int]) -> list[int]:
    return [now - then for now, then in zip(started(replicas), before)]


def home(replicas: Sequence[ServerProcess], before: list[int]) -> int:
    """The index of the one replica that started one request since `before`."""
    moved = since(replicas, before)
    assert sorted(moved) == [0] * (len(moved) - 1) + [1], f"requests started per replica: {moved}"
    return moved.index(1)


def session_on(nginx: Nginx, replicas: Sequence[ServerProcess], index: int, tries: int = 16) -> str:
    """A session id that nginx hashes to replicas[index] (found by asking; the ring depends on the
    replicas' ports, which are new each run)."""
    with client(nginx) as c:
        for n in range(tries):
            before = started(replicas)
            ok(post(c, nginx, [{"role": "user", "content": "Hi."}], f"probe-{n}", max_tokens=1))
            if home(replicas, before) == index:
                return f"probe-{n}"
    raise AssertionError(f"none of {tries} session ids hashed to replica {index}")


def read_frames(chunks: Iterator[bytes], at_least: int) -> bytes:
    raw = b""
    while content_frames(raw) < at_least:
        raw += next(chunks)
    return raw


@contextmanager
def filled(server: ServerProcess) -> Iterator[None]:
    """The small replica with its one row running and every waiting place taken."""
    body = {"messages": STORY, "max_tokens": LONG, "stream": True}
    with httpx.Client(timeout=60) as c, ExitStack() as streams:
        running = streams.enter_context(c.stream("POST", server.url + CHAT, json=body))
        chunks = running.iter_bytes()  # held: a dropped iterator closes the stream
        read_frames(chunks, 1)
        for _ in range(SMALL_WAITING):
            waiting = streams.enter_context(c.stream("POST", server.url + CHAT, json=body))
            assert waiting.status_code == 200  # its SSE headers come once it is queued
        wait_for_stats(server.url, lambda s: s["num_requests_waiting"] == SMALL_WAITING)
        yield
        del chunks
    tokens_settle(server.url)


# -- (a) spread, (b) affinity ----------------------------------------------------------------


def test_requests_without_a_session_spread_over_the_replicas(pool: Pool) -> None:
    before = started(pool.replicas)

    def one(n: int) -> bytes:
        with client(pool.nginx) as c:
            return stream_to_end(c, pool.nginx, f"Tell story number {n}.")

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(one, range(4)))
    spread = since(pool.replicas, before)
    assert sum(spread) == 4 and min(spread) >= 1, f"requests started per replica: {spread}"


@dataclass(frozen=True)
class TwoTurns:
    homes: tuple[int, int]
    first_prompt_tokens: int
    second_cached_tokens: int


def two_turns(c: httpx.Client, pool: Pool, topic: str, session: str | None) -> TwoTurns:
    """A conversation of two turns through nginx: where each turn ran, and how much of turn two's
    prompt its replica found in its prefix cache."""
    first_messages = [{"role": "user", "content": f"{topic}: name three birds."}]
    before = started(pool.replicas)
    first = ok(post(c, pool.nginx, first_messages, session, max_tokens=3))
    first_home = home(pool.replicas, before)
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    before = started(pool.replicas)
    second_messages = [*first_messages, reply, {"role": "user", "content": "And fish?"}]
    second = ok(post(c, pool.nginx, second_messages, session, max_tokens=3))
    second_home = home(pool.replicas, before)
    return TwoTurns(
        (first_home, second_home),
        int(first["usage"]["prompt_tokens"]),
        int(second["usage"]["prompt_tokens_details"]["cached_tokens"]),
    )


def test_session_header_pins_a_conversation_to_one_replica(pool: Pool) -> None:
    with client(pool.nginx) as c:
        # The control: without the header, least connections sends turn two to the other
        # replica, whose prefix cache has never seen turn one.
        loose = two_turns(c, pool, "Conversation loose", None)
        pinned = {n: two_turns(c, pool, f"Conversation {n}", f"talk-{n}") for n in range(12)}
    assert loose.homes[0] != loose.homes[1]
    assert loose.second_cached_tokens < loose.first_prompt_tokens - 1
    for n, turns in pinned.items():
        assert turns.homes[0] == turns.homes[1], f"talk-{n} moved: {turns}"
        # Turn two found all of turn one's prompt in its replica's cache.
        assert turns.second_cached_tokens >= turns.first_prompt_tokens - 1, f"talk-{n}: {turns}"
    # Sessions are spread over the replicas, not all sent to one (2**-11 odds of a false alarm).
    assert {t.homes[0] for t in pinned.values()} == {0, 1}


# -- (d) a 429 is retried on another replica before any byte ---------------------------------


def test_full_replica_429_is_retried_on_the_other_before_any_byte(pool: Pool) -> None:
    small, roomy = pool.replicas
    nginx = pool.nginx
    session = session_on(nginx, pool.replicas, 0)  # a conversation whose home is the small one
    messages = [{"role": "user", "content": "Hi again."}]
    with filled(small):
        # The condition holds: asked directly, the small replica refuses.
        assert (
            httpx.post(small.url + CHAT, json={"messages": messages, "max_tokens": 2}, timeout=30).status_code
            == 429
        )
        before, logged = started(pool.replicas), len(nginx.upstream_log())
        with client(nginx) as c:
            ok(post(c, nginx, messages, session, max_tokens=3))
            stream_to_end(c, nginx, "Hi once more.", session)
        assert since(pool.replicas, before) == [0, 2]
    lines = nginx.upstream_log()[logged:]
    assert len(lines) == 2, lines
    for line in lines:
        assert f'upstream="127.0.0.1:{small.port}, 127.0.0.1:{roomy.port}"' in line, line
        assert 'upstream_status="429, 200"' in line, line


def test_without_http_429_in_proxy_next_upstream_the_client_gets_the_429(pool: Pool, tmp_path: Path) -> None:
    # The control for the test above: the retry is the site's doing, not luck.
    def no_429_retry(site: str) -> str:
        assert site.count(" http_429 ") == 1
        return site.replace(" http_429 ", " ")

    small = pool.replicas[0]
    nginx = Nginx([r.port for r in pool.replicas], tmp_path, edit=no_429_retry, site=REPLICAS_SITE).start()
    try:
        session = session_on(nginx, pool.replicas, 0)
        with filled(small), client(nginx) as c:
            refused = post(c, nginx, [{"role": "user", "content": "Hi again."}], session)
    finally:
        nginx.stop()
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"


def test_with_no_replica_left_the_client_gets_a_json_503_not_nginxs_502(tmp_path: Path) -> None:
    # Two replicas that refuse every connection: each request tries both (nginx's own 502), and
    # after max_fails both rest, so nginx has none to try ("no live upstreams", a 502 again).
    nginx = Nginx([free_port(), free_port()], tmp_path, site=REPLICAS_SITE).start()
    try:
        with client(nginx) as c:
            answers = [
                post(c, nginx, [{"role": "user", "content": "Hi."}], f"s{n}" if n % 2 else None)
                for n in range(8)
            ]
    finally:
        nginx.stop()
    errors = (tmp_path / "error.log").read_text()
    assert "Connection refused" in errors and "no live upstreams" in errors
    for r in answers:
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/json"
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "no_replica_available"
        assert r.json()["type"] == "error" and r.json()["error"]["message"]


# -- (e), (c) a replica killed mid-run -------------------------------------------------------


@dataclass
class Crash:
    nginx: Nginx
    survivor: ServerProcess
    victim: ServerProcess
    session: str  # a session id whose home is the victim
    frames_before_kill: int  # content frames the streaming client had read when the victim died
    stream_tail: bytes  # what it read after
    stream_error: str | None  # how its stream ended: the client's error, or None for a clean end
    queued: httpx.Response  # the non-streamed request (/v1/completions) waiting on the victim
    survivor_started: int  # requests the survivor started from the kill until `queued` came back
    log: list[str]  # nginx's upstream lines for the stream and the queued request

    def line(self, path: str) -> str:
        [line] = [ln for ln in self.log if f'"POST {path} ' in ln]
        return line


def post_alone(nginx: Nginx, session: str) -> httpx.Response:
    body = {"prompt": "A short poem:", "max_tokens": 4}
    with client(nginx) as c:
        return c.post(nginx.url + COMPLETIONS, json=body, headers=session_header(session))


@pytest.fixture(scope="module")
def crash(pool: Pool, smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crash]:
    """A victim replica (small) beside the roomy one behind a second nginx: a stream runs on the
    victim, a request of the same session waits behind it, and the victim is SIGKILLed."""
    folder = tmp_path_factory.mktemp("crash")
    survivor = pool.replicas[1]  # the roomy one
    [victim] = start_replicas(smollm_path, folder, SMALL)
    try:
        nginx = Nginx([survivor.port, victim.port], folder, site=REPLICAS_SITE).start()
        replicas = [survivor, victim]
        session = session_on(nginx, replicas, 1)
        logged, before = len(nginx.upstream_log()), started(replicas)
        body = {"messages": STORY, "max_tokens": LONG, "stream": True}
        with (
            client(nginx, read_s=20) as c,
            c.stream("POST", nginx.url + CHAT, json=body, headers=session_header(session)) as stream,
            ThreadPoolExecutor(1) as ex,
        ):
            assert stream.status_code == 200
            chunks = stream.iter_bytes()
            before_kill = read_frames(chunks, 3)
            assert home(replicas, before) == 1
            # The same conversation's next request waits behind it on the victim (one row): it
            # was sent, and nothing of its answer has been.
            queued = ex.submit(post_alone, nginx, session)
            wait_for_stats(victim.url, lambda s: s["num_requests_waiting"] == 1)
            survivor_before = started([survivor])
            kill_replica(victim)
            tail, error = b"", None
            try:
                for chunk in chunks:
                    tail += chunk
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            answer = queued.result(timeout=60)
        yield Crash(
            nginx,
            survivor,
            victim,
            session,
            content_frames(before_kill),
            tail,
            error,
            answer,
            since([survivor], survivor_before)[0],
            nginx.upstream_log()[logged:],
        )
        nginx.stop()
    finally:
        victim.close()


def upstreams(line: str) -> str:
    return line.split('upstream="', 1)[1].split('"', 1)[0]


def test_a_stream_cut_by_a_dying_replica_ends_in_an_error_and_is_not_replayed(crash: Crash) -> None:
    victim, survivor = f"127.0.0.1:{crash.victim.port}", f"127.0.0.1:{crash.survivor.port}"
    assert crash.frames_before_kill >= 3  # it really was streaming
    # The client is told: the stream breaks off with an error (nginx resets the HTTP/2 stream),
    # without a terminal frame; it does not end as if it were complete, nor hang.
    assert b"[DONE]" not in crash.stream_tail
    assert crash.stream_error is not None, crash.stream_tail[-300:]
    assert crash.stream_error.startswith("RemoteProtocolError"), crash.stream_error
    # Not replayed: nginx's line for the stream names the victim alone, and the survivor started
    # only what nginx sent it (the queued /v1/completions request, if anything).
    assert upstreams(crash.line(CHAT)) == victim, crash.log
    assert crash.survivor_started == sum(survivor in upstreams(line) for line in crash.log), crash.log


def test_a_killed_replica_loses_no_request_that_had_not_started_streaming(crash: Crash) -> None:
    victim, survivor = f"127.0.0.1:{crash.victim.port}", f"127.0.0.1:{crash.survivor.port}"
    # The request that was waiting on the victim (sent, but no byte of its answer) was sent
    # again to the survivor, and answered.
    assert crash.queued.status_code == 200, crash.queued.text
    assert crash.queued.json()["choices"][0]["text"]
    assert upstreams(crash.line(COMPLETIONS)) == f"{victim}, {survivor}"
    assert crash.survivor_started == 1
    # Requests sent after the kill, with the victim's session and without any, all succeed on
    # the survivor, and it keeps serving.
    before = started([crash.survivor])

    def one(n: int) -> int:
        with client(crash.nginx) as c:
            pinned = crash.session if n % 2 else None
            return post(c, crash.nginx, [{"role": "user", "content": f"Count to {n}."}], pinned).status_code

    with ThreadPoolExecutor(6) as ex:
        statuses = list(ex.map(one, range(6)))
    assert statuses == [200] * 6
    with client(crash.nginx) as c:
        stream_to_end(c, crash.nginx, "One more story.")
    assert since([crash.survivor], before) == [7]
    assert httpx.get(crash.survivor.url + "/health", timeout=5).status_code == 200

"""Tier 2: the ASGI app and the one writer, with a fake engine and hand-driven receive/send."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson

from mlx_serve.engine.host.thread import ThreadEngine
from mlx_serve.server.app import App
from mlx_serve.server.cli import with_cors
from mlx_serve.server.config import Config
from tests.support.asgi import call, wait_until
from tests.support.fake_engine import fake_engine

CHAT = orjson.dumps(
    {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
)
CHAT_STREAM = orjson.dumps(
    {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 50,
    }
)


def started(engine: ThreadEngine, **config: Any) -> App:
    app = App(Config(**config), engine)
    engine.start()
    return app


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def ready(app: App) -> App:
    await app.engine.wait_ready()
    return app


def test_app_chat_json_collects_every_piece() -> None:
    engine, _ = fake_engine(["Hel", "lo", "!"])

    async def go() -> Any:
        app = await ready(started(engine))
        return await call(app, "POST", "/v1/chat/completions", CHAT)

    r = run(go())
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "Hello!"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 4  # three pieces and the EOS, as mlx-lm counts


def test_app_chat_stream_frames_in_order_and_done() -> None:
    engine, _ = fake_engine(["a", "b"])

    async def go() -> Any:
        app = await ready(started(engine))
        return await call(app, "POST", "/v1/chat/completions", CHAT_STREAM)

    r = run(go())
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no"
    data = r.sse_data()
    assert data[-1] == "[DONE]"
    chunks = [orjson.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "ab"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_app_stream_sends_heartbeats_while_quiet() -> None:
    engine, _ = fake_engine(["a", "b"], step_s=0.35)

    async def go() -> Any:
        app = await ready(started(engine, heartbeat_s=0.1))
        return await call(app, "POST", "/v1/chat/completions", CHAT_STREAM)

    r = run(go())
    assert b": keep-alive" in r.body
    assert r.sse_data()[-1] == "[DONE]"


def test_app_disconnect_mid_stream_aborts_engine_at_once() -> None:
    engine, runners = fake_engine([f"t{i} " for i in range(200)], step_s=0.01)

    async def go() -> Any:
        app = await ready(started(engine))
        r = await call(
            app,
            "POST",
            "/v1/chat/completions",
            CHAT_STREAM.replace(b'"max_tokens":50', b'"max_tokens":200'),
            disconnect_after_chunks=3,
        )
        await wait_until(lambda: engine.counters.requests_aborted == 1)
        return r

    run(go())
    assert runners[0].steps_taken and runners[0].steps_taken[0] < 20


def test_app_disconnect_while_waiting_for_json_aborts() -> None:
    engine, runners = fake_engine([f"t{i} " for i in range(300)], step_s=0.01)

    async def go() -> None:
        app = await ready(started(engine))
        r = await call(
            app,
            "POST",
            "/v1/chat/completions",
            CHAT.replace(b'"max_tokens":50', b'"max_tokens":300'),
            disconnect_after_s=0.2,
        )
        assert r.status == 0  # nothing was sent to a client that left
        await wait_until(lambda: engine.counters.requests_aborted == 1)

    run(go())
    assert runners[0].steps_taken[0] < 100


def test_app_engine_fault_mid_stream_sends_error_frame() -> None:
    engine, _ = fake_engine(["a", "b", "c"], fail_after=1)

    async def go() -> Any:
        app = await ready(started(engine))
        r = await call(app, "POST", "/v1/chat/completions", CHAT_STREAM)
        ok = await call(app, "POST", "/v1/chat/completions", CHAT_STREAM)
        return r, ok

    r, _ = run(go())
    data = r.sse_data()
    assert data[-1] == "[DONE]"
    err = orjson.loads(data[-2])["error"]
    assert err["type"] == "server_error" and "simulated engine fault" in err["message"]


def test_app_engine_fault_before_any_token_is_500_json() -> None:
    engine, _ = fake_engine(["a"], fail_after=0)

    async def go() -> Any:
        app = await ready(started(engine))
        return await call(app, "POST", "/v1/chat/completions", CHAT)

    r = run(go())
    assert r.status == 500 and r.json()["error"]["type"] == "server_error"


def test_app_health_is_503_while_loading_then_200() -> None:
    gate = threading.Event()
    engine, _ = fake_engine(["a"], load_gate=gate)

    async def go() -> tuple[Any, Any, Any]:
        app = started(engine)
        loading = await call(app, "GET", "/health")
        busy = await call(app, "POST", "/v1/chat/completions", CHAT)
        gate.set()
        await app.engine.wait_ready()
        return loading, busy, await call(app, "GET", "/health")

    loading, busy, ok = run(go())
    assert loading.status == 503 and loading.json()["status"] == "loading"
    assert busy.status == 503 and busy.json()["error"]["type"] == "server_error"
    assert ok.status == 200 and ok.json() == {"status": "ok"}


def test_app_health_is_503_when_model_failed_to_load() -> None:
    engine, _ = fake_engine(["a"], load_error="no weights")

    async def go() -> Any:
        app = started(engine)
        await wait_until(lambda: engine.state.value == "failed")
        return await call(app, "GET", "/health")

    r = run(go())
    assert r.status == 503 and "no weights" in r.json()["error"]


def test_app_body_over_limit_is_413() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> Any:
        app = await ready(started(engine, max_body_bytes=100))
        return await call(app, "POST", "/v1/chat/completions", b"x" * 101)

    r = run(go())
    assert r.status == 413 and "limit" in r.json()["error"]["message"]


def test_app_unknown_route_is_404_and_wrong_method_405() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> tuple[Any, Any]:
        app = await ready(started(engine))
        return await call(app, "GET", "/v2/nothing"), await call(app, "GET", "/v1/chat/completions")

    missing, wrong = run(go())
    assert missing.status == 404 and missing.json()["error"]["message"].startswith("no route")
    assert wrong.status == 405 and wrong.headers["allow"] == "POST"


def test_app_head_answers_a_get_route_without_a_body() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> Any:
        return await call(await ready(started(engine)), "HEAD", "/health")

    r = run(go())
    assert r.status == 200 and r.body == b"" and r.headers["content-length"] == "15"


def test_app_mlx_lm_server_paths_without_v1() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> tuple[Any, Any]:
        app = await ready(started(engine))
        prompt = orjson.dumps({"prompt": "hi", "max_tokens": 5})
        return await call(app, "POST", "/chat/completions", CHAT), await call(
            app, "POST", "/completions", prompt
        )

    chat, text = run(go())
    assert chat.status == 200 and chat.json()["choices"][0]["message"]["content"] == "a"
    assert text.status == 200 and text.json()["choices"][0]["text"] == "a"


def test_app_model_names_the_server_accepts() -> None:
    engine, _ = fake_engine(["a"])

    def chat(model: str | None) -> bytes:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        return orjson.dumps(body if model is None else {**body, "model": model})

    async def go() -> list[Any]:
        app = await ready(started(engine, served_model_name=["coder", "claude-*"]))
        names = [None, "fake-model", "default", "coder", "claude-sonnet-4-5", "gpt-4o", "claude"]
        return [await call(app, "POST", "/v1/chat/completions", chat(n)) for n in names]

    *served, gpt, bare = run(go())
    assert [r.status for r in served] == [200] * 5
    assert [r.json()["model"] for r in served] == [
        "fake-model",
        "fake-model",
        "default",
        "coder",
        "claude-sonnet-4-5",
    ]
    for refused in (gpt, bare):
        err = refused.json()["error"]
        assert refused.status == 404 and err["param"] == "model" and err["code"] == "model_not_found"
        assert "fake-model, coder" in err["message"]


def test_app_count_tokens_refuses_the_models_messages_refuses() -> None:
    engine, _ = fake_engine(["a"])

    def body(model: str) -> bytes:
        return orjson.dumps(
            {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        )

    async def go() -> list[Any]:
        app = await ready(started(engine, served_model_name=["claude-*"]))
        paths = ["/v1/messages/count_tokens", "/v1/messages"]
        return [await call(app, "POST", p, body(m)) for m in ("claude-x", "gpt-4o") for p in paths]

    counted, answered, *refused = run(go())
    assert counted.status == answered.status == 200 and counted.json()["input_tokens"] > 0
    assert [r.status for r in refused] == [404, 404]
    assert refused[0].json() == refused[1].json()
    assert refused[0].json()["error"]["type"] == "not_found_error"


def test_app_models_lists_the_served_model() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> tuple[Any, Any, Any]:
        app = await ready(started(engine))
        return (
            await call(app, "GET", "/v1/models"),
            await call(app, "GET", "/v1/models/fake-model"),
            await call(app, "GET", "/v1/models/other"),
        )

    listing, one, other = run(go())
    assert listing.json()["data"][0]["id"] == "fake-model" and listing.json()["object"] == "list"
    assert one.json()["id"] == "fake-model" and one.json()["object"] == "model"
    assert other.status == 404
    card = listing.json()["data"][0]
    limit = engine.model.context_length if engine.model else None
    assert card["context_length"] == card["max_model_len"] == card["max_context_length"] == limit


def test_app_models_lists_one_id_while_loading_and_after() -> None:
    # The id a client reads while the model loads is the one it keeps: `--model x.gguf` is "x".
    gate = threading.Event()
    engine, _ = fake_engine(["a"], load_gate=gate, context=4096)

    async def go() -> tuple[Any, Any]:
        app = started(engine, model="/models/fake-model.gguf")
        loading = await call(app, "GET", "/v1/models")
        gate.set()
        await app.engine.wait_ready()
        return loading, await call(app, "GET", "/v1/models")

    loading, loaded = run(go())
    assert (
        [m["id"] for m in loading.json()["data"]]
        == [m["id"] for m in loaded.json()["data"]]
        == ["fake-model"]
    )
    assert loaded.json()["data"][0]["context_length"] == 4096


def test_app_models_in_anthropic_shape_for_anthropic_clients() -> None:
    engine, _ = fake_engine(["a"], context=2048)

    async def go() -> Any:
        app = await ready(started(engine, served_model_name=["coder"]))
        return await call(app, "GET", "/v1/models", headers=[(b"anthropic-version", b"2023-06-01")])

    body = run(go()).json()
    assert [m["id"] for m in body["data"]] == ["fake-model", "coder"]
    assert body["data"][0]["type"] == "model" and body["has_more"] is False and body["last_id"] == "coder"
    # What the anthropic SDK's ModelInfo carries and Claude Code sizes its context window from.
    limits = {"max_input_tokens": 2048, "max_tokens": 2048, "lifecycle": "active"}
    assert all(m.items() >= limits.items() for m in body["data"])


def test_app_bad_json_is_400_and_engine_keeps_serving() -> None:
    engine, _ = fake_engine(["ok"])

    async def go() -> tuple[Any, Any]:
        app = await ready(started(engine))
        return (
            await call(app, "POST", "/v1/chat/completions", b"{not json"),
            await call(app, "POST", "/v1/chat/completions", CHAT),
        )

    bad, good = run(go())
    assert bad.status == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert good.status == 200


def test_app_cors_only_when_origins_allowed() -> None:
    engine, _ = fake_engine(["a"])
    origin = [(b"origin", b"https://app.example")]

    async def go() -> tuple[Any, Any]:
        closed = await ready(started(engine))
        engine2, _ = fake_engine(["a"])
        open_ = await ready(started(engine2, allowed_origins=["https://app.example"]))
        return (
            await call(with_cors(closed, []), "GET", "/health", headers=origin),
            await call(with_cors(open_, open_.config.allowed_origins), "GET", "/health", headers=origin),
        )

    closed, open_ = run(go())
    assert "access-control-allow-origin" not in closed.headers
    assert open_.headers["access-control-allow-origin"] == "https://app.example"


def test_app_n_choices_json_and_stream() -> None:
    engine, _ = fake_engine(["x", "y"])
    body = orjson.loads(CHAT)
    body["n"] = 3

    async def go() -> tuple[Any, Any]:
        app = await ready(started(engine))
        whole = await call(app, "POST", "/v1/chat/completions", orjson.dumps(body))
        streamed = await call(
            app,
            "POST",
            "/v1/chat/completions",
            orjson.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
        )
        return whole, streamed

    whole, streamed = run(go())
    choices = whole.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["message"]["content"] == "xy" for c in choices)
    assert whole.json()["usage"]["completion_tokens"] == 9
    data = streamed.sse_data()
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    chunks = [orjson.loads(d) for d in data[:-1]]
    text = {i: "" for i in range(3)}
    for c in chunks:
        for ch in c["choices"]:
            text[ch["index"]] += ch["delta"].get("content") or ""
    assert text == {0: "xy", 1: "xy", 2: "xy"}
    assert sum(1 for c in chunks for ch in c["choices"] if ch["finish_reason"]) == 3
    assert chunks[-1]["usage"]["completion_tokens"] == 9


def test_app_full_queue_is_429_with_retry_after_before_any_stream() -> None:
    engine, _ = fake_engine([f"t{i}" for i in range(100)], step_s=0.01, capacity=2)
    long_stream = CHAT_STREAM.replace(b'"max_tokens":50', b'"max_tokens":100')

    async def go() -> tuple[Any, Any]:
        app = await ready(started(engine))
        running = [
            asyncio.create_task(call(app, "POST", "/v1/chat/completions", long_stream)) for _ in range(2)
        ]
        await wait_until(lambda: engine.gate.inflight == 2)
        refused = await call(app, "POST", "/v1/chat/completions", CHAT_STREAM)
        done = await asyncio.gather(*running)
        after = await call(app, "POST", "/v1/chat/completions", CHAT)
        return refused, (done, after)

    refused, (done, after) = run(go())
    assert refused.status == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert all(r.sse_data()[-1] == "[DONE]" for r in done)
    assert after.status == 200 and engine.gate.inflight == 0


TOOL_PIECES = [
    "Sure. ",
    "<tool",
    "_call>",
    '{"name": "get_weather", ',
    '"arguments": {"city": "Paris"}}',
    "</tool_call>",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_app_tool_calls_in_openai_json_and_stream() -> None:
    import openai

    engine, _ = fake_engine(TOOL_PIECES)
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "max_tokens": 50,
    }

    async def go() -> tuple[Any, Any, Any]:
        app = await ready(started(engine))
        whole = await call(app, "POST", "/v1/chat/completions", orjson.dumps(body))
        streamed = await call(app, "POST", "/v1/chat/completions", orjson.dumps({**body, "stream": True}))
        untooled = await call(
            app, "POST", "/v1/chat/completions", orjson.dumps({**body, "tool_choice": "none"})
        )
        return whole, streamed, untooled

    whole, streamed, untooled = run(go())
    msg = openai.types.chat.ChatCompletion.model_validate(whole.json()).choices[0]
    assert msg.finish_reason == "tool_calls" and msg.message.content == "Sure. "
    call_ = msg.message.tool_calls[0]  # type: ignore[index]
    assert call_.function.name == "get_weather" and orjson.loads(call_.function.arguments) == {
        "city": "Paris"
    }
    chunks = [
        openai.types.chat.ChatCompletionChunk.model_validate(orjson.loads(d))
        for d in streamed.sse_data()[:-1]
    ]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert (deltas[0].id or "").startswith("call_") and deltas[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert orjson.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks)
    plain = untooled.json()["choices"][0]
    assert plain["finish_reason"] == "stop" and "<tool_call>" in plain["message"]["content"]


def test_app_tool_calls_in_anthropic_and_responses() -> None:
    engine, _ = fake_engine(TOOL_PIECES)
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    messages = {
        "model": "fake-model",
        "max_tokens": 50,
        "tools": [tool],
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
    }
    responses = {
        "model": "fake-model",
        "input": "Weather in Paris?",
        "tools": [{"type": "function", "name": "get_weather", "parameters": tool["input_schema"]}],
    }

    async def go() -> tuple[Any, Any]:
        app = await ready(started(engine))
        return (
            await call(app, "POST", "/v1/messages", orjson.dumps(messages)),
            await call(app, "POST", "/v1/responses", orjson.dumps(responses)),
        )

    msg, resp = run(go())
    m = msg.json()
    assert m["stop_reason"] == "tool_use"
    use = next(b for b in m["content"] if b["type"] == "tool_use")
    assert (
        use["name"] == "get_weather" and use["input"] == {"city": "Paris"} and use["id"].startswith("toolu_")
    )
    items = [i for i in resp.json()["output"] if i["type"] == "function_call"]
    assert items[0]["name"] == "get_weather" and orjson.loads(items[0]["arguments"]) == {"city": "Paris"}


def test_app_reasoning_kept_apart_from_the_answer() -> None:
    engine, _ = fake_engine(["<thi", "nk>", "The user", " asks.", "</think>", "Paris."], thinking=True)
    messages = {
        "model": "fake-model",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "Capital?"}],
    }

    async def go() -> tuple[Any, Any, Any]:
        app = await ready(started(engine))
        return (
            await call(app, "POST", "/v1/chat/completions", CHAT),
            await call(app, "POST", "/v1/chat/completions", CHAT_STREAM),
            await call(app, "POST", "/v1/messages", orjson.dumps(messages)),
        )

    whole, streamed, anthropic = run(go())
    msg = whole.json()["choices"][0]["message"]
    assert (msg["reasoning"], msg["reasoning_content"], msg["content"]) == ("The user asks.",) * 2 + (
        "Paris.",
    )
    chunks = [orjson.loads(d) for d in streamed.sse_data()[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "The user asks."
    assert "".join(d.get("content") or "" for d in deltas) == "Paris."
    blocks = anthropic.json()["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text"] and blocks[0]["thinking"] == "The user asks."


def test_app_completions_several_prompts_are_one_batched_call() -> None:
    engine, runners = fake_engine(["x", "y"], step_s=0.01)
    body = {"model": "fake-model", "prompt": ["ab", [5, 6, 7]], "n": 2, "max_tokens": 50}

    async def go() -> tuple[Any, Any]:
        app = await ready(started(engine))
        whole = await call(app, "POST", "/v1/completions", orjson.dumps(body))
        streamed = await call(app, "POST", "/v1/completions", orjson.dumps({**body, "stream": True}))
        return whole, streamed

    whole, streamed = run(go())
    out = whole.json()
    assert [(c["index"], c["text"]) for c in out["choices"]] == [(i, "xy") for i in range(4)]
    assert out["usage"]["prompt_tokens"] == 2 + 3 and out["usage"]["completion_tokens"] == 12
    assert runners[0].max_rows_seen == 4  # every choice of every prompt decoded together
    data = streamed.sse_data()
    assert data.count("[DONE]") == 1 and data[-1] == "[DONE]"
    indexes = {ch["index"] for d in data[:-1] for ch in orjson.loads(d)["choices"]}
    assert indexes == {0, 1, 2, 3}


def test_app_responses_compact() -> None:
    engine, _ = fake_engine(["The user", " said hi."])

    async def go() -> tuple[Any, Any, Any]:
        app = await ready(started(engine))
        ok = await call(
            app, "POST", "/v1/responses/compact", orjson.dumps({"model": "fake-model", "input": "hi"})
        )
        no_model = await call(app, "POST", "/v1/responses/compact", orjson.dumps({"input": "hi"}))
        other = await call(
            app, "POST", "/v1/responses/compact", orjson.dumps({"model": "gpt-4o", "input": "hi"})
        )
        return ok, no_model, other

    ok, no_model, other = run(go())
    body = ok.json()
    assert ok.status == 200 and body["object"] == "response.compaction"
    assert [i["type"] for i in body["output"]] == ["message", "compaction"]
    assert body["output"][0]["role"] == "user" and body["usage"]["output_tokens"] > 0
    assert (no_model.status, no_model.json()["error"]["param"]) == (400, "model")
    assert (other.status, other.json()["error"]["param"]) == (404, "model")


def test_app_protocol_warnings_are_sent_and_logged(caplog: Any) -> None:
    engine, _ = fake_engine(["ok"])
    body = {
        "model": "fake-model",
        "input": "hi",
        "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {"type": "web_search"},
        ],
    }

    async def go() -> Any:
        app = await ready(started(engine))
        return await call(app, "POST", "/v1/responses", orjson.dumps(body))

    with caplog.at_level("WARNING", logger="mlx_serve.http"):
        r = run(go())
    assert r.status == 200
    hosted, no_tools = r.all("warning")
    assert "'web_search'" in hosted
    # The fake tokenizer's template reads no `tools`: the model is told of them in a system message.
    assert "no tool support" in no_tools
    assert any("web_search" in rec.getMessage() for rec in caplog.records)


def test_app_tells_the_protocols_the_context_length() -> None:
    engine, _ = fake_engine(["ok"])

    async def go() -> Any:
        app = await ready(started(engine))
        assert app.engine.model is not None
        return app.context().context_length, app.engine.model.context_length

    seen, model = run(go())
    assert seen == model

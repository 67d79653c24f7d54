"""`mlx-serve`: parse flags, pick the BLAS, start the engine and Hypercorn."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from server.config import Config, load_config


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["service"]:  # `mlx-serve service print-plist|print-systemd [flags]`
        from server.service import main as service_main

        sys.exit(service_main(args[1:]))
    config = load_config(args)
    from engine.backend import prefer_shape_free_attention
    from engine.blas import reexec_with_blas

    prefer_shape_free_attention()  # before the BLAS re-exec, which passes the environment on
    reexec_with_blas(config.blas)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        pass


def engine_settings(config: Config) -> Any:
    from engine.build import EngineSettings

    return EngineSettings(
        max_running=min(config.decode_concurrency, config.prefill_step_size),
        max_prefilling=config.prompt_concurrency,
        token_budget=config.prefill_step_size,
        max_waiting=config.max_queue,
        prompt_cache_size=config.prompt_cache_size,
        prompt_cache_bytes=config.prompt_cache_bytes,
        seed=config.seed,
        memory_budget_bytes=config.memory_budget_bytes,
        max_context=config.max_context,
        draft_kind=config.draft_kind,
        num_draft_tokens=config.num_draft_tokens,
        speculation_gated=config.speculation_gate == "auto",
        draft_spec=draft_spec(config),
        tool_call_parser=config.tool_call_parser,
    )


def draft_spec(config: Config) -> Any:
    from engine.loader import prepare

    if not config.draft_model:
        return None
    return prepare(
        config.draft_model, trust_remote_code=config.trust_remote_code, dequantize=config.dequantize
    )


def model_spec(config: Config) -> Any:
    from engine.loader import prepare

    return prepare(
        config.model,
        adapter_path=config.adapter_path,
        chat_template=config.chat_template,
        trust_remote_code=config.trust_remote_code,
        dequantize=config.dequantize,
    )


def build_engine(config: Config) -> Any:
    """A child-process engine (the default) or one on a thread of this process."""
    from engine.build import load_and_build, load_draft, make_core
    from engine.loader import LoadedModel, load_model, load_tokenizer
    from engine.process import ProcessEngine
    from engine.thread import Engine

    settings = engine_settings(config)
    if config.engine == "thread":
        holder: dict[str, Any] = {}

        def load() -> LoadedModel:
            spec = model_spec(config)
            holder["adapter"] = spec.adapter_path
            loaded = load_model(spec)
            if settings.draft_spec is not None:
                holder["draft"] = load_draft(loaded, settings.draft_spec)
            return loaded

        return Engine(
            load,
            lambda loaded, counters: make_core(
                loaded, counters, settings, holder.get("adapter"), holder.get("draft")
            ),
            capacity=settings.capacity,
        )

    def prepare() -> tuple[Any, tuple[Any, ...]]:
        spec = model_spec(config)
        view = LoadedModel(model=None, tokenizer=load_tokenizer(spec), model_id=spec.model_id, path=spec.path)
        return view, (load_and_build, (spec, settings))

    return ProcessEngine(prepare, capacity=settings.capacity)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def greeting(config: Config) -> str:
    scheme = "https" if config.certfile else "http"
    url = f"{scheme}://{_url_host(config.host)}:{config.port}"
    example = (
        f"curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
        '-d \'{"messages":[{"role":"user","content":"Hello!"}]}\''
    )
    return (
        f"mlx-serve: listening on {url} (OpenAI base URL {url}/v1); "
        f"/health is 503 until the model is ready\n  try: {example}"
    )


async def serve(config: Config) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    from server.app import App
    from server.shutdown import Drain

    drain = Drain()
    engine = build_engine(config)
    app, trace = serving_stack(App(config, engine), engine, config, drain)
    hc = HypercornConfig()
    hc.bind = [f"{_url_host(config.host)}:{config.port}"]
    hc.keep_alive_timeout = config.keep_alive_s
    hc.startup_timeout = config.startup_timeout_s
    # Streams get --shutdown-timeout-s to finish (the app then ends them); the margin lets the
    # error frames go out before Hypercorn closes what is left.
    hc.graceful_timeout = config.shutdown_timeout_s + SHUTDOWN_MARGIN_S
    hc.read_timeout = None
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    if config.certfile:  # HTTPS; Hypercorn offers ALPN h2 then http/1.1. Plain ports speak h2c too.
        hc.certfile, hc.keyfile = config.certfile, config.keyfile
    stop = asyncio.Event()

    def on_signal() -> None:
        stop.set()
        drain.begin(config.shutdown_timeout_s)

    fatal: list[str] = []

    def on_fatal(error: str) -> None:  # the model cannot fit: refuse to run, do not restart
        print(f"mlx-serve: cannot serve: {error}", file=sys.stderr, flush=True)
        fatal.append(error)
        stop.set()

    engine.on_fatal = on_fatal
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    print(greeting(config), file=sys.stderr, flush=True)
    try:
        await hypercorn_serve(app, hc, shutdown_trigger=stop.wait)
    finally:
        if trace is not None:
            trace.close()
    if fatal:
        sys.exit(1)


# -- deployment wiring (issue 6): keys, metrics, per-request records ----------------------------
SHUTDOWN_MARGIN_S = 5.0


def serving_stack(app: Any, engine: Any, config: Config, drain: Any) -> tuple[Any, Any]:
    """The app behind its middleware: records/metrics outermost, then API keys, then /metrics."""
    from server.auth import ApiKeys, AuthMiddleware, KeyFileError, load_api_keys, open_paths
    from server.metrics import Metrics, MetricsEndpoint
    from server.observe import RequestObserver, TraceWriter

    try:
        keys = ApiKeys(load_api_keys(config))
    except KeyFileError as exc:
        raise SystemExit(f"mlx-serve: {exc}") from exc
    if not keys and config.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("mlx_serve").warning(
            "listening on %s without an API key (--api-key-file)", config.host
        )
    metrics = Metrics(in_flight=drain.__len__)
    trace = TraceWriter(config.trace) if config.trace else None
    inner = AuthMiddleware(MetricsEndpoint(app, metrics, engine), keys, open_paths(config))
    return RequestObserver(inner, metrics, drain, trace), trace

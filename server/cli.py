"""`mlx-serve`: parse flags, pick the BLAS, start the engine and Hypercorn."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING

from mlx_serve.server.config import Config, load_config

# `mlx-serve COMMAND ...` (server.commands); anything else is the serving command's flags
COMMANDS = ("pull", "ls", "rm", "ps", "doctor", "fit", "bench", "launch")

log = logging.getLogger("mlx_serve")

if TYPE_CHECKING:  # the engine is imported only once the flags are read (fast --help)
    from mlx_serve.engine.host.client import EngineClient
    from mlx_serve.engine.host.settings import EngineSettings, ModelSource
    from mlx_serve.protocols.contract import ASGIApp
    from mlx_serve.server.app import App
    from mlx_serve.server.observe import TraceWriter
    from mlx_serve.server.shutdown import Drain


PROCESS_NAME = b"mlx-serve"  # what `ps -e` and `pgrep mlx-serve` show on Linux (15 bytes at most)


def name_process() -> None:
    """Linux: name this process mlx-serve, whatever started it (`python3 -m mlx_serve` too)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).prctl(15, PROCESS_NAME, 0, 0, 0)  # PR_SET_NAME
        except (OSError, AttributeError):
            pass  # a libc without prctl: the name stays the interpreter's


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["service"]:  # `mlx-serve service print-plist|print-systemd [flags]`
        from mlx_serve.server.service import main as service_main

        sys.exit(service_main(args[1:]))
    if args[:1] in (["help"], ["commands"]):
        from mlx_serve.server.commands import USAGE

        print(USAGE)
        return
    if args[:1] == ["serve"]:
        from mlx_serve.server.commands import serve_args

        args = serve_args(args[1:])
    elif args and args[0] in COMMANDS:
        from mlx_serve.server.commands import run

        sys.exit(run(args))
    config = load_config(args)
    name_process()
    from mlx_serve.engine.host.build import prepare_process
    from mlx_serve.engine.host.settings import LOG_FORMAT

    engines_are_children = config.engine == "process" and config.shard is None
    prepare_process(config.blas, computes_here=not engines_are_children)
    logging.basicConfig(level=config.log_level, format=LOG_FORMAT)
    if config.log_level != "DEBUG":  # its "Running on ..." line repeats our own greeting
        logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    from mlx_serve.server.many import is_many

    if engines_are_children and not is_many(config):
        from mlx_serve.engine.host.spare import start_spare

        start_spare()  # the engine process's imports overlap the server's start-up from here
    if config.use_default_chat_template:
        log.warning("--use-default-chat-template has no effect: the model's own chat template is used")
    if config.shard is not None:
        from mlx_serve.engine.host.shard.group import launch_rank

        if launch_rank() not in (None, 0):  # a follower rank: no HTTP, rank 0's steps until the group ends
            from mlx_serve.engine.host.shard.follower import serve_follower

            sys.exit(serve_follower(engine_settings(config), model_source(config)))
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # the port is taken, the address is not ours, the cert is unreadable
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc.strerror or exc)
        sys.exit(1)


def engine_settings(config: Config) -> EngineSettings:
    from mlx_serve.engine.host.settings import EngineSettings

    return EngineSettings(
        max_running=(
            min(config.decode_concurrency, config.prefill_step_size) if config.decode_concurrency else None
        ),
        max_prefilling=config.prompt_concurrency,
        token_budget=config.prefill_step_size,
        max_step_s=None if config.max_step_ms is None else config.max_step_ms / 1000,
        max_waiting=config.max_queue,
        prompt_cache_size=config.prompt_cache_size,
        prompt_cache_bytes=config.prompt_cache_bytes,
        prompt_cache_dir=config.prompt_cache_dir,
        prompt_cache_disk_bytes=config.prompt_cache_disk_bytes,
        seed=config.seed,
        memory_budget_bytes=config.memory_budget_bytes,
        max_context=config.max_context,
        draft_kind=config.draft_kind,
        num_draft_tokens=config.num_draft_tokens,
        speculation_gated=config.speculation_gate == "auto",
        tool_call_parser=config.tool_call_parser,
        shard=config.shard,
        warmup=config.warmup,
        stall_s=config.engine_stall_s,
        restart_stalled=config.engine_stall_action == "restart",
        kv_bits=config.kv_bits,
        kv_group_size=config.kv_group_size,
    )


def model_source(config: Config) -> ModelSource:
    from mlx_serve.engine.host.settings import ModelSource

    return ModelSource(
        model=config.model,
        adapter_path=config.adapter_path,
        chat_template=config.chat_template,
        trust_remote_code=config.trust_remote_code,
        dequantize=config.dequantize,
        draft_model=config.draft_model,
        host=config.engine,
    )


def build_engine(config: Config) -> EngineClient:
    """A child-process engine (the default) or one on a thread of this process."""
    from mlx_serve.engine.host.build import build

    return build(engine_settings(config), model_source(config))


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
    from hypercorn.config import Config as HypercornConfig

    from mlx_serve.server import connections
    from mlx_serve.server.app import App
    from mlx_serve.server.many import build_registry, is_many
    from mlx_serve.server.metrics import Metrics
    from mlx_serve.server.shutdown import Drain

    drain = Drain()
    engine = build_registry(config, build_engine) if is_many(config) else build_engine(config)
    served = App(config, engine, Metrics(in_flight=drain.__len__))
    app, trace = serving_stack(served, config, drain)
    hc = HypercornConfig()
    hc.bind = [f"{_url_host(config.host)}:{config.port}"]
    hc.keep_alive_timeout = config.keep_alive_s
    hc.startup_timeout = config.startup_timeout_s
    # Streams get --shutdown-timeout-s to finish (the app then ends them); the margin lets the
    # error frames go out before Hypercorn closes what is left.
    hc.graceful_timeout = config.shutdown_timeout_s + SHUTDOWN_MARGIN_S
    # No per-read timeout: a stream, or a long JSON answer, reads nothing from its client for
    # minutes. A body has --body-timeout-s to arrive (the app's), a head --keep-alive-s.
    hc.read_timeout = None
    hc.h11_max_incomplete_size = hc.h2_max_header_list_size = config.max_header_bytes
    hc.websocket_max_message_size = config.max_body_bytes  # a socket's turn is a request body
    hc.backlog = min(config.max_connections, 1024)
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    if config.certfile:  # HTTPS; Hypercorn offers ALPN h2 then http/1.1. Plain ports speak h2c too.
        hc.certfile, hc.keyfile = config.certfile, config.keyfile
    stop = asyncio.Event()

    def on_signal() -> None:
        stop.set()
        drain.begin(config.shutdown_timeout_s)

    fatal: list[str] = []

    def on_fatal(error: str) -> None:  # nothing to serve: exit 1 (a service manager restarts us)
        log.error("cannot serve: %s", error)
        fatal.append(error)
        loop.call_soon_threadsafe(stop.set)

    if served.registry.single:  # with several models, one that fails leaves the others serving
        served.engine.on_fatal = on_fatal
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    gate = connections.ConnectionGate(
        connections.connection_cap(config.max_connections), app, bool(config.certfile)
    )
    try:
        await connections.serve(
            app, hc, gate, shutdown_trigger=stop.wait, listening=lambda: log.info("%s", greeting(config))
        )
    finally:
        if trace is not None:
            trace.close()
    if fatal:
        sys.exit(1)


# -- deployment wiring (issue 6): keys, metrics, per-request records ----------------------------
SHUTDOWN_MARGIN_S = 5.0


def serving_stack(app: App, config: Config, drain: Drain) -> tuple[ASGIApp, TraceWriter | None]:
    """The app behind its middleware: CORS outermost (so a 401 or 429 carries its headers), then
    the per-request records and metrics, then API keys; all read the app's one route table."""
    from mlx_serve.server.auth import ApiKeys, AuthMiddleware, KeyFileError, load_api_keys
    from mlx_serve.server.observe import RequestObserver, TraceWriter

    try:
        keys = ApiKeys(load_api_keys(config))
    except KeyFileError as exc:
        raise SystemExit(f"mlx-serve: {exc}") from exc
    if not keys and config.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("mlx_serve").warning(
            "listening on %s without an API key (--api-key-file)", config.host
        )
    trace = TraceWriter(config.trace) if config.trace else None
    observed = RequestObserver(
        AuthMiddleware(app, keys, app.table), app.metrics, drain, trace, app.table, watcher=app.recent
    )
    return with_cors(observed, config.allowed_origins), trace


def with_cors(app: ASGIApp, origins: list[str]) -> ASGIApp:
    """Starlette's CORS middleware around everything, when --allowed-origins names any."""
    if not origins:
        return app
    from starlette.middleware.cors import CORSMiddleware

    return CORSMiddleware(
        app,
        allow_origins=origins,
        allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
        # Any header from an allowed origin: the browser SDKs send their own (x-stainless-*,
        # anthropic-dangerous-direct-browser-access, openai-project) and add more each release.
        allow_headers=["*"],
        expose_headers=["warning", "retry-after"],
        max_age=600,
    )

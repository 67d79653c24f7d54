"""`mlx-serve`: parse flags, pick the BLAS, start the engine and Hypercorn."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from server.config import Config, load_config


def main(argv: list[str] | None = None) -> None:
    config = load_config(argv)
    from engine.blas import reexec_with_blas

    reexec_with_blas(config.blas)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        pass


def engine_settings(config: Config) -> Any:
    from engine.assemble import EngineSettings

    return EngineSettings(max_running=min(config.decode_concurrency, config.prefill_step_size),
                          max_prefilling=config.prompt_concurrency,
                          token_budget=config.prefill_step_size,
                          max_waiting=config.max_queue,
                          prompt_cache_size=config.prompt_cache_size,
                          prompt_cache_bytes=config.prompt_cache_bytes,
                          seed=config.seed)


def model_spec(config: Config) -> Any:
    from engine.loader import prepare

    return prepare(config.model, adapter_path=config.adapter_path,
                   chat_template=config.chat_template, trust_remote_code=config.trust_remote_code)


def build_engine(config: Config) -> Any:
    """A child-process engine (the default) or one on a thread of this process."""
    from engine.assemble import load_and_build, make_core
    from engine.engine import Engine
    from engine.loader import LoadedModel, load_model, load_tokenizer
    from engine.process import ProcessEngine

    settings = engine_settings(config)
    if config.engine == "thread":
        holder: dict[str, Any] = {}

        def load() -> LoadedModel:
            spec = model_spec(config)
            holder["adapter"] = spec.adapter_path
            loaded = load_model(spec)
            return loaded

        return Engine(load, lambda loaded, counters: make_core(loaded, counters, settings,
                                                                holder.get("adapter")))

    def prepare() -> tuple[Any, tuple[Any, ...]]:
        spec = model_spec(config)
        view = LoadedModel(model=None, tokenizer=load_tokenizer(spec), model_id=spec.model_id,
                           path=spec.path)
        return view, (load_and_build, (spec, settings))

    return ProcessEngine(prepare)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def greeting(config: Config) -> str:
    url = f"http://{_url_host(config.host)}:{config.port}"
    example = (f"curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
               "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'")
    return (f"mlx-serve: listening on {url} (OpenAI base URL {url}/v1); "
            f"/health is 503 until the model is ready\n  try: {example}")


async def serve(config: Config) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    from server.app import App

    app = App(config, build_engine(config))
    hc = HypercornConfig()
    hc.bind = [f"{_url_host(config.host)}:{config.port}"]
    hc.keep_alive_timeout = config.keep_alive_s
    hc.startup_timeout = config.startup_timeout_s
    hc.graceful_timeout = 5.0
    hc.read_timeout = None
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(greeting(config), file=sys.stderr, flush=True)
    await hypercorn_serve(app, hc, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

"""`mlx-serve`: parse flags, pick the BLAS, start the engine and Hypercorn."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from server.config import Config, load_config


DEFAULT_PROMPT_CACHE_BYTES = 1 << 30


def main(argv: list[str] | None = None) -> None:
    config = load_config(argv)
    from engine.blas import reexec_with_blas

    reexec_with_blas(config.blas)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(config))
    except KeyboardInterrupt:
        pass


def make_loader(config: Config) -> Any:
    def load() -> Any:
        import mlx.core as mx

        from engine.loader import load as load_model

        if config.seed is not None:
            mx.random.seed(config.seed)
        loaded = load_model(config.model, adapter_path=config.adapter_path,
                            chat_template=config.chat_template,
                            trust_remote_code=config.trust_remote_code)
        print(banner(config, loaded), flush=True)
        return loaded

    return load


def make_core_factory(config: Config) -> Any:
    def make_core(loaded: Any, counters: Any) -> Any:
        from engine.core import Core
        from engine.prefix_cache import PrefixCache
        from engine.runner import BatchRunner
        from engine.scheduler import Scheduler, SchedulerConfig

        sched = Scheduler(SchedulerConfig(max_running=config.decode_concurrency,
                                          max_prefilling=config.prompt_concurrency,
                                          token_budget=config.prefill_step_size,
                                          max_waiting=config.max_queue),
                          frozenset(loaded.tokenizer.eos_token_ids))
        prefix = PrefixCache(f"{loaded.model_id}|{config.adapter_path or ''}",
                             max_entries=config.prompt_cache_size,
                             max_bytes=config.prompt_cache_bytes or DEFAULT_PROMPT_CACHE_BYTES)
        runner = BatchRunner(loaded.model, prefill_step_size=config.prefill_step_size, prefix_cache=prefix)
        return Core(sched, runner, loaded.tokenizer, counters, prefix)

    return make_core


def banner(config: Config, loaded: Any) -> str:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.blas import blas_in_use

    dtypes = sorted({str(v.dtype).removeprefix("mlx.core.") for _, v in tree_flatten(loaded.model.parameters())})
    url = f"http://{_url_host(config.host)}:{config.port}"
    example = (f"curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
               "-d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'")
    return "\n".join([
        f"mlx-serve: serving {loaded.model_id}",
        f"  device: {mx.default_device()}  dtypes: {', '.join(dtypes)}",
        f"  BLAS: {blas_in_use()}",
        f"  listening on {url}  (OpenAI: {url}/v1)",
        f"  try: {example}",
    ])


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def serve(config: Config) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config as HypercornConfig

    from engine.engine import Engine
    from server.app import App

    engine = Engine(make_loader(config), make_core_factory(config))
    app = App(config, engine)
    hc = HypercornConfig()
    hc.bind = [f"{_url_host(config.host)}:{config.port}"]
    hc.keep_alive_timeout = config.keep_alive_s
    hc.startup_timeout = config.startup_timeout_s
    hc.graceful_timeout = 5.0
    hc.read_timeout = None
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.h11_max_incomplete_size = 64 * 1024
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"mlx-serve: loading model, listening on {hc.bind[0]} (/health is 503 until ready)",
          file=sys.stderr, flush=True)
    await hypercorn_serve(app, hc, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

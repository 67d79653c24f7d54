"""The models this server serves: one engine client per model, loaded on demand within memory.

A request's `model` resolves here (a dict read; globs after); `ensure` gives its engine, loading
it first when it is not loaded. A load goes ahead when the model's memory need fits beside what
is loaded, else the least recently used idle models are unloaded first (a model with requests in
flight, a pinned one, or one still loading is never chosen); a model that cannot fit at all is a
503 naming what it needs and what the budget has. Each engine is given its own share of the
budget (engine.model.fit's estimate, or an even share), so two engines never each plan for the
whole machine. One child process per model: a crash in one leaves the others serving.

With one model (plain `--model`) the registry holds that one engine, started with the server and
never unloaded: the server behaves exactly as a one-model server.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from mlx_serve.engine.errors import EngineUnavailable, ServeError
from mlx_serve.engine.host.client import EngineClient, EngineState
from mlx_serve.engine.validation import Limits
from mlx_serve.protocols.contract import ModelNotFound, ProtocolContext
from mlx_serve.server.budget import GIB, Need, Resident, allot, evictions
from mlx_serve.server.models_file import ModelEntry
from mlx_serve.server.names import GLOB_CHARS, ServedNames

log = logging.getLogger("mlx_serve.models")
DEFAULT_NAMES = ("", "default", "default_model")
OLLAMA_TAG = ":latest"


class NoRoom(EngineUnavailable):
    """The loaded models are busy, pinned or still loading: no room for this one now."""


class ModelDoesNotFit(ServeError):
    """The model needs more memory than the budget holds (or than loaded busy models leave)."""

    status = 503


class NamedModel(msgspec.Struct):
    """The `model` a request body names, read apart from the rest."""

    model: str | None = None
    name: str | None = None  # Ollama's /api/show spells it so too


def named(body: bytes) -> str | None:
    """The `model` a body names; None when it names none or is not JSON (its parse then says
    what is wrong)."""
    try:
        found = msgspec.json.decode(body, type=NamedModel)
    except msgspec.DecodeError:
        return None
    return found.model or found.name


class Slot:
    """One servable model: its entry, its engine while loaded, its per-model protocol facts."""

    def __init__(self, entry: ModelEntry, engine: EngineClient | None = None) -> None:
        self.entry = entry
        self.engine = engine
        self.allotted = 0  # the budget its engine was given (0: the server's whole budget)
        self.need: Need | None = None
        self.last_used = time.monotonic()
        self.holds = 0  # requests using it now (never unloaded under them)
        self.ctx: ProtocolContext | None = None  # cached per loaded engine (server.app)
        self.limits = Limits(0)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def state(self) -> str:
        """loaded, loading, unloaded, or failed (with the engine's error)."""
        engine = self.engine
        if engine is None:
            return "unloaded"
        if engine.state is EngineState.READY:
            return "loaded"
        if engine.state is EngineState.LOADING:
            return "loading"
        return "failed" if engine.state is EngineState.FAILED else engine.state.value

    def names(self) -> ServedNames:
        return ServedNames(self.entry.name, self.entry.source, self.entry.aliases)

    def evictable(self) -> bool:
        return (
            self.engine is not None
            and self.holds == 0
            and not self.entry.pinned
            and self.state != "loading"
            and self.engine.gate.inflight == 0
        )


class Registry:
    """Name → Slot, the memory budget across them, loads, unloads and their progress events."""

    def __init__(
        self,
        slots: list[Slot],
        make_engine: Callable[[ModelEntry, int | None], EngineClient] | None = None,
        budget_bytes: int = 0,
        estimate: Callable[[ModelEntry], Need | None] | None = None,
        idle_unload_s: float = 0.0,
    ) -> None:
        self.slots = {s.name: s for s in slots}
        self.default = slots[0]
        self.single = make_engine is None  # one model, started with the server, never unloaded
        self._make = make_engine
        self.budget = budget_bytes
        self._estimate = estimate
        self.idle_unload_s = idle_unload_s
        self._exact: dict[str, Slot] = {}
        self._globs: list[tuple[str, Slot]] = []
        for slot in slots:
            self._index(slot)
        self.watchers: list[asyncio.Queue[dict[str, Any]]] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._progress: LoaderProgress | None = None

    def _index(self, slot: Slot) -> None:
        e = slot.entry
        for name in (e.name, *e.aliases):
            if GLOB_CHARS & set(name):
                self._globs.append((name, slot))
            else:
                self._exact.setdefault(name, slot)
        if e.source and not GLOB_CHARS & set(e.source):
            self._exact.setdefault(e.source, slot)

    @classmethod
    def one(cls, engine: EngineClient) -> Registry:
        return cls([Slot(ModelEntry(name=""), engine)])

    # -- names -----------------------------------------------------------------------------

    def resolve(self, name: str | None) -> Slot | None:
        """The slot a request's `model` picks; None: not served here."""
        if not name or name in DEFAULT_NAMES:
            return self.default
        slot = self._exact.get(name) or self._exact.get(name.removesuffix(OLLAMA_TAG))
        if slot is not None:
            return slot
        return next((s for pattern, s in self._globs if fnmatch.fnmatchcase(name, pattern)), None)

    def listed(self) -> list[str]:
        return [n for s in self.slots.values() for n in s.names().listed]

    def refusal(self, name: str) -> str:
        return f"model '{name}' is not served here; use one of: {', '.join(self.slots)}"

    # -- loading ---------------------------------------------------------------------------

    async def ensure(self, slot: Slot) -> EngineClient:
        """The slot's engine, ready: loaded first (room made) when it is not. One load per call:
        a model that fails to load says why (the next request tries again)."""
        engine = slot.engine
        if engine is None or engine.state in (EngineState.STOPPED, EngineState.FAILED) and not self.single:
            engine = await self._load_when_room(slot)
        if engine.state is not EngineState.READY:
            await engine.wait_ready()
        return engine

    async def _load_when_room(self, slot: Slot) -> EngineClient:
        while True:
            try:
                return self.load(slot)
            except NoRoom:
                loading = [s.engine for s in self.slots.values() if s.state == "loading" and s.engine]
                if not loading:
                    raise
                # a model still loading may be unloaded once it is ready and idle: wait, try again
                await asyncio.wait([asyncio.ensure_future(_settled(e)) for e in loading])

    @contextlib.asynccontextmanager
    async def picked(self, body: bytes) -> AsyncIterator[Slot]:
        """The model a request body names (the one model on a one-model server: the body is not
        read), loaded, and held while the request runs (never unloaded under it)."""
        if self.single:
            yield self.default
            return
        wanted = named(body)
        slot = self.resolve(wanted)
        if slot is None:
            raise ModelNotFound(self.refusal(wanted or ""), param="model")
        async with self.use(slot):
            await self.ensure(slot)
            yield slot

    @contextlib.asynccontextmanager
    async def use(self, slot: Slot) -> AsyncIterator[None]:
        """While a request uses the slot: not unloaded; its end counts as the last use."""
        slot.holds += 1
        try:
            yield
        finally:
            slot.holds -= 1
            slot.last_used = time.monotonic()

    def load(self, slot: Slot) -> EngineClient:
        """Start loading the slot's model (after making room); its engine, not yet ready."""
        if slot.engine is not None and slot.engine.state in (EngineState.LOADING, EngineState.READY):
            return slot.engine
        assert self._make is not None, "a one-model server loads its model at start"
        if slot.engine is not None:  # failed or stopped: a fresh engine
            slot.engine.stop()
            slot.engine = None
        need = self.need_of(slot) or self.budget // len(self.slots)  # not known: an even share
        self._make_room(slot, need)
        share = allot(self.budget, need, self.free(), len(self.slots))
        engine = self._make(slot.entry, share or None)
        loop = asyncio.get_running_loop()

        def failed(error: str) -> None:  # a thread host says so from its own thread
            loop.call_soon_threadsafe(self._failed, slot, error)

        engine.on_fatal = failed
        slot.engine, slot.allotted, slot.ctx = engine, share, None
        slot.last_used = time.monotonic()
        log.info("loading model %s (memory budget %.2f GiB)", slot.name, share / GIB)
        self.publish(slot, "loading")
        engine.start()
        asyncio.get_running_loop().create_task(self._announce_ready(slot, engine))
        return engine

    async def _announce_ready(self, slot: Slot, engine: EngineClient) -> None:
        with contextlib.suppress(ServeError):
            await engine.wait_ready()
        if slot.engine is engine and engine.ready:
            self.publish(slot, "ready")

    def _failed(self, slot: Slot, error: str) -> None:
        log.error("model %s: %s", slot.name, error)
        self.publish(slot, "failed", error=error)

    def need_of(self, slot: Slot) -> int:
        if slot.need is None and self._estimate is not None:
            try:
                slot.need = self._estimate(slot.entry)
            except Exception as exc:  # noqa: BLE001 - an unreadable model fails at its load instead
                log.debug("no memory estimate for %s: %s", slot.name, exc)
        return slot.need.nbytes if slot.need is not None else 0

    def free(self) -> int:
        return self.budget - sum(s.allotted for s in self.slots.values() if s.engine is not None)

    def _make_room(self, slot: Slot, need: int) -> None:
        if need > self.budget:
            raise ModelDoesNotFit(
                f"model '{slot.name}' needs about {need / GIB:.2f} GiB (weights and one context of KV) "
                f"and the memory budget is {self.budget / GIB:.2f} GiB (--memory-budget)",
                param="model",
            )
        residents = [
            Resident(s.name, s.allotted, s.last_used, s.evictable()) for s in self.slots.values() if s.engine
        ]
        chosen = evictions(residents, self.free(), max(need, 1))
        if chosen is None:
            busy = [s.name for s in self.slots.values() if s.engine is not None]
            raise NoRoom(
                f"model '{slot.name}' needs about {need / GIB:.2f} GiB and {self.free() / GIB:.2f} GiB "
                f"is free: the loaded models ({', '.join(busy)}) are busy or pinned; try again shortly",
                param="model",
            )
        for name in chosen:
            log.info("unloading model %s (least recently used) to make room for %s", name, slot.name)
            self.unload(self.slots[name])

    def unload(self, slot: Slot) -> bool:
        """Stop the slot's engine and free its memory; False when there was nothing to stop."""
        engine, slot.engine = slot.engine, None
        slot.allotted, slot.ctx = 0, None
        if engine is None:
            return False
        engine.stop()
        self.publish(slot, "unloaded")
        return True

    # -- lifetime --------------------------------------------------------------------------

    def start(self) -> None:
        """At server start: the one model; or the default and every pinned model."""
        if self.single:
            assert self.default.engine is not None
            self.default.engine.start()
            return
        for slot in self.slots.values():
            if slot is self.default or slot.entry.pinned:
                try:
                    self.load(slot)
                except ServeError as exc:
                    log.error("model %s is not loaded at start: %s", slot.name, exc)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        self._progress = LoaderProgress(self, asyncio.get_running_loop())
        logging.getLogger(LOADER_LOG).addHandler(self._progress)

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._progress is not None:
            logging.getLogger(LOADER_LOG).removeHandler(self._progress)
        for slot in self.slots.values():
            if slot.engine is not None:
                slot.engine.stop()

    def idle_limit(self, slot: Slot) -> float:
        limit = slot.entry.idle_unload_s
        return self.idle_unload_s if limit is None else limit

    def sweep(self, now: float) -> list[str]:
        """Unload every model idle past its --idle-unload-s (pinned ones never)."""
        gone = []
        for slot in self.slots.values():
            limit = self.idle_limit(slot)
            if limit > 0 and slot.evictable() and now - slot.last_used >= limit:
                log.info("unloading model %s: idle for %.0f s", slot.name, now - slot.last_used)
                self.unload(slot)
                gone.append(slot.name)
        return gone

    async def _sweep_forever(self) -> None:
        limits = [self.idle_limit(s) for s in self.slots.values() if self.idle_limit(s) > 0]
        if not limits:
            return
        period = min(max(min(limits) / 4, 0.25), 30.0)
        while True:
            await asyncio.sleep(period)
            self.sweep(time.monotonic())

    def stats_source(self) -> EngineClient | Unloaded:
        """What /metrics reads: the default model's engine (or, while it is unloaded, nothing)."""
        return self.default.engine or Unloaded()

    # -- progress ----------------------------------------------------------------------------

    def loading_progress(self, status: str, detail: str) -> None:
        """A fetching or converting step of the loads under way (the loader does not say whose)."""
        for slot in self.slots.values():
            if slot.state == "loading":
                self.publish(slot, status, detail=detail)

    def publish(self, slot: Slot, status: str, **extra: Any) -> None:
        event = {"model": slot.name, "status": status, **extra}
        for queue in self.watchers:
            queue.put_nowait(event)


LOADER_LOG = "mlx_serve.loader"  # engine.model.loader's progress lines
PROGRESS = {"fetch": "fetching", "join": "fetching", "assembl": "fetching", "convert": "converting"}


class LoaderProgress(logging.Handler):
    """The model loader's progress lines (fetching slice packages, joining, converting a GGUF)
    as `fetching` and `converting` events of the model loading, from whichever thread logs."""

    def __init__(self, registry: Registry, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.INFO)
        self.registry, self.loop = registry, loop

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        status = next((s for prefix, s in PROGRESS.items() if message.startswith(prefix)), None)
        if status is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.registry.loading_progress, status, message)


async def _settled(engine: EngineClient) -> None:
    """The engine has loaded, or failed to."""
    with contextlib.suppress(ServeError):
        await engine.wait_ready()


class Unloaded:
    """/metrics' engine while the default model is not loaded: no counters."""

    state = EngineState.STOPPED

    async def stats(self) -> dict[str, Any]:
        return {}

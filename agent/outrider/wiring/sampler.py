"""The sweep loop: runs every enabled collector each interval and keeps the latest sweep for the exporters.

Exporters never trigger collection; they read the latest sweep. Rendering for /metrics is cached per sweep, so a
scrape costs a dictionary lookup and a socket write.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable

from outrider import collectors as registry
from outrider.collectors.base import Collector, CollectorContext, CollectorStatus, SweepStats
from outrider.ground.config import Config
from outrider.metrics.exposition import Format, KeepingRenderer, Renderer
from outrider.metrics.family import Family
from outrider.metrics.protobuf_exposition import ProtobufRenderer

LOG = logging.getLogger("outrider.sampler")


class _Guarded:
    """Runs a collector that may block on its own thread; a sweep waits for it at most timeout_s."""

    def __init__(self, collector: Collector, timeout_s: float) -> None:
        self.collector = collector
        self.timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._result: list[Family] = []
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._result = self.collector.collect()
            self._error = None
        except BaseException as e:
            self._result, self._error = [], e
        finally:
            self._done.set()

    def collect(self) -> list[Family] | None:
        """The collector's families; None while it is hung (still inside the previous or this call)."""
        if self._thread is not None and self._thread.is_alive():
            return None
        self._done.clear()
        self._thread = threading.Thread(target=self._run, name=f"outrider-{self.collector.name}", daemon=True)
        self._thread.start()
        if not self._done.wait(self.timeout_s):
            return None
        if self._error is not None:
            raise self._error
        return self._result


class Sampler:
    def __init__(self, config: Config, roots: tuple[int, ...] = (), exclude_pids: frozenset[int] = frozenset(),
                 collectors: list[Collector] | None = None, hold_spool_lock: bool = True) -> None:
        self.config = config
        self.stats = SweepStats()
        self.ctx = CollectorContext(config, self.stats, roots or config.pids, exclude_pids, hold_spool_lock)
        self.collectors = collectors if collectors is not None else registry.build(self.ctx, config.collectors)
        self._guards: dict[str, _Guarded] = {}
        self._families: list[Family] = []
        self._generation = 0
        self._rendered: dict[tuple[Format, bool], tuple[int, bytes]] = {}
        self._renderers: dict[Format, KeepingRenderer[str] | KeepingRenderer[bytes]] = {}
        # per (format, gzip): the last two generations served, to render ahead only for a scraper that asks every sweep
        self._served: dict[tuple[Format, bool], tuple[int, int]] = {}
        self._render_lock = threading.Lock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        self.listeners: list[Callable[[list[Family]], None]] = self.ctx.listeners

    def sweep(self) -> list[Family]:
        """Run every collector once. A collector that raises is marked failed and skipped; the sweep goes on.

        Listeners (the rule engine, the diagnosis) see the sweep before it is published; collectors that report
        on what listeners did (`after_listeners`: the alerts) run after them, so /metrics shows this sweep's alerts.
        """
        t0 = time.perf_counter()
        fams: list[Family] = []
        late = [c for c in self.collectors if c.after_listeners]
        for c in self.collectors:
            if not c.after_listeners:
                self._run_collector(c, fams)
        for listener in self.listeners:
            try:
                listener(fams)
            except Exception:
                LOG.exception("sweep listener failed")
        for c in late:
            self._run_collector(c, fams)
        self.stats.sweeps += 1
        self.stats.last_sweep_s = time.perf_counter() - t0
        self.stats.last_sweep_monotonic = time.monotonic()
        with self._lock:
            self._families = fams
            self._generation += 1
        self.ready.set()
        return fams

    def _run_collector(self, c: Collector, fams: list[Family]) -> None:
        c0 = time.perf_counter()
        status = self.stats.collectors.setdefault(c.name, CollectorStatus())
        try:
            got = self._collect(c)
            if got is None:
                status.success = False
                if not status.hung:
                    LOG.warning("collector %s has not answered within %g s (a hung driver call?): the sweep "
                                "goes on without it; reported in outrider_collector_hung", c.name,
                                self.config.collector_timeout_s)
                status.hung = True
            else:
                if status.hung:
                    LOG.info("collector %s answers again", c.name)
                status.success, status.hung = True, False
                fams.extend(got)
        except Exception as e:
            status.success = False
            if c.errors == 0 or LOG.isEnabledFor(logging.DEBUG):
                LOG.warning("collector %s failed: %s: %s (reported in outrider_collector_success)",
                            c.name, type(e).__name__, e)
            c.errors += 1
        status.duration_s = time.perf_counter() - c0
        status.errors = c.errors

    def _collect(self, c: Collector) -> list[Family] | None:
        if not c.may_block:
            return c.collect()
        guard = self._guards.get(c.name)
        if guard is None:
            guard = self._guards[c.name] = _Guarded(c, self.config.collector_timeout_s)
        return guard.collect()

    @property
    def families(self) -> list[Family]:
        with self._lock:
            return self._families

    def exposition(self, fmt: Format = "text", compressed: bool = False) -> bytes:
        """The latest sweep rendered (and gzipped if asked), computed once per sweep and format."""
        key = (fmt, compressed)
        gen, fams, cached = self._serve(key)
        if cached is not None:
            return cached
        return self._render(key, gen, fams)

    def rendered(self, fmt: Format = "text", compressed: bool = False) -> bytes | None:
        """The latest sweep's exposition if it is rendered already (rendered ahead, or by an earlier scrape of this
        sweep), else None: what the HTTP server's loop thread answers without rendering."""
        return self._serve((fmt, compressed))[2]

    def _serve(self, key: tuple[Format, bool]) -> tuple[int, list[Family], bytes | None]:
        """A scrape of the latest sweep in this format: noted (for rendering ahead), and its body if rendered."""
        with self._lock:
            gen, fams = self._generation, self._families
            cached = self._rendered.get(key)
            last = self._served.get(key, (0, 0))
            if last[0] != gen:
                self._served[key] = (gen, last[0])
        return gen, fams, cached[1] if cached is not None and cached[0] == gen else None

    def _render(self, key: tuple[Format, bool], gen: int, fams: list[Family]) -> bytes:
        fmt, compressed = key
        # One render at a time: a renderer keeps last sweep's text, and concurrent scrapes of a new sweep wait
        # for the first one's body instead of rendering it again.
        with self._render_lock:
            with self._lock:
                cached = self._rendered.get(key)
            if cached is not None and cached[0] == gen:
                return cached[1]
            renderer = self._renderers.get(fmt)
            if renderer is None:
                renderer = self._renderers[fmt] = ProtobufRenderer() if fmt == "protobuf" else \
                    Renderer(openmetrics=fmt == "openmetrics")
            plain = self._rendered.get((fmt, False))
            body = plain[1] if plain is not None and plain[0] == gen else renderer.render(fams)
            if compressed:  # a gzip member (wbits 31) with no timestamp: gzip.compress's own header and CRC pass
                body = zlib.compress(body, 1, 31)  # cost 12% more
            with self._lock:
                self._rendered[key] = (gen, body)
        return body

    def _render_ahead(self) -> None:
        """Render (and gzip) the new sweep now for a scraper that asked for each of the last two sweeps.

        The same work the scrape would do, but done while the sweep's code and objects are still in the CPU's
        caches: after the half second or more a scrape comes later, rendering measured 2-4x its warm cost. A
        scraper slower than the sweep (every other sweep or less) never asks twice in a row, so nothing is
        rendered that no one fetches.
        """
        with self._lock:
            gen, fams = self._generation, self._families
            due = [key for key, (last, before) in self._served.items() if last == gen - 1 and before == gen - 2]
        for key in due:
            self._render(key, gen, fams)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="outrider-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        interval = self.config.interval_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sweep()
                self._render_ahead()
            except Exception:  # never let the loop die
                LOG.exception("sweep failed")
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # fell behind (suspended, or a slow sweep): skip, don't burst
                next_at = now + interval
            self._stop.wait(next_at - now)

    def healthy(self) -> bool:
        """Alive, and the last sweep is no older than three intervals."""
        if self._thread is None or not self._thread.is_alive():
            return False
        return time.monotonic() - self.stats.last_sweep_monotonic <= 3 * self.config.interval_s + 1

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sweeping (waiting for the thread at most timeout_s) and close the collectors."""
        self.halt(timeout_s)
        self.close()

    def halt(self, timeout_s: float = 5.0) -> None:
        """Stop the sweeping thread, waiting for it at most timeout_s; the collectors stay open for a last sweep."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def close(self) -> None:
        """Close the collectors (the hook collector lets go of the spool): no sweep after this one."""
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                LOG.exception("closing collector %s failed", c.name)

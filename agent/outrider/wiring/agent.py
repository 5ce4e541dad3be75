"""The agent: the sweep loop, the /metrics endpoint and OTLP export wired together, with a bounded shutdown."""

from __future__ import annotations

import errno
import logging
import signal
import threading
import time
from typing import Any

from outrider.exporters.prometheus import Endpoints, MetricsServer, alerts_api_json
from outrider.exporters.rotation import BasicAuthFiles, SecretFileError
from outrider.ground.config import Config, ConfigError, otlp_enabled
from outrider.wiring import alerting, lifecycle
from outrider.wiring.sampler import Sampler

LOG = logging.getLogger("outrider.agent")


def _endpoint_security(config: Config) -> tuple[tuple[str, str] | None, BasicAuthFiles | None]:
    """TLS files and basic-auth credentials for /metrics, checked now so a mistake stops the start, clearly; both
    are read again when their files change (exporters/rotation.py)."""
    tls = None
    if config.tls_cert_file or config.tls_key_file:
        if not (config.tls_cert_file and config.tls_key_file):
            raise ConfigError("tls_cert_file and tls_key_file go together: set both or neither")
        tls = (config.tls_cert_file, config.tls_key_file)
    auth = None
    user_set = bool(config.basic_auth_username or config.basic_auth_username_file)
    if user_set or config.basic_auth_password_file:
        if config.basic_auth_username and config.basic_auth_username_file:
            raise ConfigError("basic_auth_username and basic_auth_username_file: set one of them")
        if not (user_set and config.basic_auth_password_file):
            raise ConfigError("basic_auth_username (or basic_auth_username_file) and basic_auth_password_file go "
                              "together: set both or neither")
        try:
            auth = BasicAuthFiles(config.basic_auth_password_file, config.basic_auth_username,
                                  config.basic_auth_username_file)
        except SecretFileError as e:
            key = "basic_auth_username_file" if e.path == config.basic_auth_username_file else \
                "basic_auth_password_file"
            raise ConfigError(f"{key}: {e}") from None
    return tls, auth


class Agent:
    def __init__(self, config: Config, roots: tuple[int, ...] = (), exclude_pids: frozenset[int] = frozenset(),
                 listen_fallback: bool = False, hold_spool_lock: bool = True) -> None:
        """Binds the listener at once, so a busy port is an error before anything starts.

        listen_fallback: on a busy port, take a free one instead, saying so (for `outrider run` and the standalone
        agent on the default address, which a sidecar or a second run may already hold). Never for an address the
        configuration names: whoever holds it would answer the scrapes meant for this agent (another user's
        process can bind a free port first and serve a page of its own), so that is an error.
        """
        self.config = config
        tls, basic_auth = _endpoint_security(config)
        self.sampler = Sampler(config, roots, exclude_pids, hold_spool_lock=hold_spool_lock)
        ctx = self.sampler.ctx
        # Upward wiring happens here and only here: collectors, exporters, rules and notifiers get plain callables.
        self.alerting = alerting.build(config, stack_dumps=lambda: list(ctx.stalled_stacks))
        if self.alerting is not None:
            engine = self.alerting.engine
            ctx.reporters.setdefault("alerts", []).extend([engine.families, self.alerting.dispatcher.families])
            self.sampler.listeners.append(engine.on_sweep)
        self.workload = lifecycle.attach(self.sampler, config)  # None unless exit_when_workload_exits
        host, port = config.listen_address
        try:
            self.server = MetricsServer(self._endpoints(), host, port, tls,
                                        basic_auth.current if basic_auth else None, protobuf=config.native_histograms)
        except OSError as e:
            if e.errno == errno.EADDRINUSE and not listen_fallback:
                raise OSError(e.errno, f"cannot listen on {config.listen}: {e.strerror or e}: another process holds "
                                       "it and would answer the scrapes meant for this agent; stop it, or listen "
                                       "elsewhere") from None
            if e.errno != errno.EADDRINUSE:
                raise OSError(e.errno, f"cannot listen on {config.listen}: {e.strerror or e}") from None
            self.server = MetricsServer(self._endpoints(), host, 0, tls, basic_auth.current if basic_auth else None,
                                        protobuf=config.native_histograms)
            LOG.warning("%s (the default address) is held by another process, which answers whatever scrapes it; "
                        "this agent serves %s/metrics instead (set listen to make a busy port an error)",
                        config.listen, self.server.url)
        ctx.reporters.setdefault("self", []).append(self.server.families)
        self.otlp: Any = None
        if otlp_enabled(config):
            from outrider.exporters.otlp import OtlpExporter

            self.otlp = OtlpExporter(config, lambda: self.sampler.families)
            ctx.reporters["self"].append(self.otlp.families)
        self._started = self._stopped = False

    def _endpoints(self) -> Endpoints:
        sampler, engine = self.sampler, self.alerting.engine if self.alerting is not None else None

        def alerts_json() -> bytes:
            return alerts_api_json([a for _, a in engine.active_alerts()] if engine is not None else [])

        return Endpoints(lambda fmt, gzip: sampler.exposition(fmt, compressed=gzip), alerts_json,
                         healthy=sampler.healthy, ready=sampler.ready.is_set,
                         rendered=lambda fmt, gzip: sampler.rendered(fmt, compressed=gzip))

    def start(self) -> None:
        self._started = True
        if self.alerting is not None:
            self.alerting.start()
        self.server.start()
        self.sampler.start()
        if self.otlp is not None:
            self.otlp.start()
        LOG.info("serving %s/metrics, sweeping every %g s with collectors %s", self.server.url,
                 self.config.interval_s, ", ".join(c.name for c in self.sampler.collectors))

    def stop(self) -> None:
        """Final sweep and flush, bounded by shutdown_timeout_s; a stuck exporter is abandoned, not waited on. An
        agent never started (`outrider run` whose command could not start) only lets go: no sweep, no export."""
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + self.config.shutdown_timeout_s

        def finish() -> None:
            self.sampler.halt(timeout_s=max(0.1, (deadline - time.monotonic()) / 2))
            if self._started and (self.alerting is not None or self.otlp is not None):
                # The latest values: the rules evaluate them (a last notification is queued before the
                # notifiers' final flush below), and the final OTLP export carries them.
                self.sampler.sweep()
            self.sampler.close()  # after the last sweep, which would take the spool's lock again
            if self.alerting is not None:
                self.alerting.stop(timeout_s=max(0.1, (deadline - time.monotonic()) / 4))
            if self.otlp is not None:
                self.otlp.shutdown(timeout_s=max(0.1, deadline - time.monotonic()))

        t = threading.Thread(target=finish, name="outrider-shutdown", daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            LOG.warning("shutdown did not finish within %g s; exiting anyway", self.config.shutdown_timeout_s)
        self.server.stop()

    def run_until_signal(self) -> int:
        """Serve until SIGTERM or SIGINT (or the workload is gone, with exit_when_workload_exits), then stop
        within the shutdown bound."""
        stop = threading.Event()
        received: list[int] = []

        def handler(signum: int, frame: object) -> None:
            received.append(signum)
            stop.set()

        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        if self.workload is not None:
            self.workload.on_gone = stop.set
        try:
            self.start()
            while not stop.wait(3600):
                pass
            if received:
                LOG.info("received %s, stopping", signal.Signals(received[0]).name)
        finally:
            self.stop()
            for s, h in previous.items():
                signal.signal(s, h)
        return 0

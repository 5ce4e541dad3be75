"""Outrider: monitoring for deep-learning training and inference.

    import outrider
    outrider.instrument()                       # publish to the agent (sidecar, `outrider run`) or start one
    for batch in outrider.dataloader(loader):   # measures the wait for each batch
        with outrider.step(samples=len(batch)): # times the step, counts samples
            ...

Services: `outrider.OutriderMiddleware` (ASGI: FastAPI, Starlette) and `outrider.OutriderWSGIMiddleware` (WSGI:
Flask, Django), loaded on first use. Existing instrumentation: `outrider.instrument(meter_provider=...)` publishes
the hook's series on an OpenTelemetry MeterProvider, `outrider.prometheus_collector()` in a prometheus_client
registry.

Importing this package is cheap and imports none of OpenTelemetry, prometheus_client, psutil, pynvml or torch.
"""

from __future__ import annotations

import os
from typing import Any

from outrider.hook import api as _api
from outrider.hook.api import (
    count_samples,
    count_tokens,
    counter,
    dataloader,
    flush,
    gauge,
    histogram,
    in_flight,
    latency,
    phase,
    record_batch_size,
    record_inter_token_latency,
    record_latency,
    record_phase,
    record_request,
    record_time_to_first_token,
    shutdown,
    step,
    step_begin,
    step_end,
    timed,
)
from outrider.hook.series import CounterSeries, GaugeSeries, HistogramSeries
from outrider.shared.version import __version__

# name -> module: the middlewares are imported when first asked for (PEP 562), so that a training script that
# imports outrider loads no web-server code.
_LAZY = {"OutriderMiddleware": "outrider.hook.asgi", "OutriderWSGIMiddleware": "outrider.hook.wsgi"}


def instrument(spool_dir: str | None = None, standalone: bool | None = None, meter_provider: Any = None) -> bool:
    """Start publishing this process's metrics (outrider.hook.api.instrument: zero-config, publishes to the agent on
    the spool or starts one, hooks into PyTorch; idempotent). Returns whether the hook is active.

    meter_provider: an OpenTelemetry MeterProvider of the application's (opentelemetry.metrics.get_meter_provider()
    for the global one): the hook's series are published on it too, under the names the agent's OTLP export uses,
    so the application's own pipeline carries them (docs/interop.md). Then the hook starts no agent of its own
    unless asked (standalone=True, OUTRIDER_STANDALONE); while an agent serves the spool anyway, it exports the
    series and the provider gets none of them, so no series is exported twice. OpenTelemetry is imported then,
    only. Given on a later call, it is added to the running hook."""
    if meter_provider is not None and standalone is None and "OUTRIDER_STANDALONE" not in os.environ:
        standalone = False  # the provider's pipeline exports the series: no second exporter of them by default
    active = _api.instrument(spool_dir, standalone)
    if active and meter_provider is not None:
        try:
            from outrider.adapters.otel_bridge import publish
        except ImportError as e:  # a provider without the opentelemetry API installed: not one this can feed
            _api.LOG.warning("outrider: no OpenTelemetry API to publish the hook's series with: %s", e)
            return active
        publish(meter_provider)
    return active


def prometheus_collector(registry: Any = None) -> Any:
    """Expose the hook's series through an existing prometheus_client registry (the default one when None): a
    service without a sidecar shows them on the /metrics it already serves. Imports prometheus_client then, only."""
    from outrider.adapters.prometheus_bridge import prometheus_collector as register

    return register(registry)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'outrider' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CounterSeries",
    "GaugeSeries",
    "HistogramSeries",
    "OutriderMiddleware",
    "OutriderWSGIMiddleware",
    "__version__",
    "count_samples",
    "count_tokens",
    "counter",
    "dataloader",
    "flush",
    "gauge",
    "histogram",
    "in_flight",
    "instrument",
    "latency",
    "phase",
    "prometheus_collector",
    "record_batch_size",
    "record_inter_token_latency",
    "record_latency",
    "record_phase",
    "record_request",
    "record_time_to_first_token",
    "shutdown",
    "step",
    "step_begin",
    "step_end",
    "timed",
]

"""Outrider: monitoring for deep-learning training and inference.

    import outrider
    outrider.instrument()                       # publish to the agent (sidecar, `outrider run`) or start one
    for batch in outrider.dataloader(loader):   # measures the wait for each batch
        with outrider.step(samples=len(batch)): # times the step, counts samples
            ...

Services: `outrider.OutriderMiddleware` (ASGI: FastAPI, Starlette) and `outrider.OutriderWSGIMiddleware` (WSGI:
Flask, Django), loaded on first use.

Importing this package is cheap and imports none of OpenTelemetry, prometheus_client, psutil, pynvml or torch.
"""

from __future__ import annotations

from typing import Any

from outrider.hook.api import (
    count_samples,
    count_tokens,
    counter,
    dataloader,
    flush,
    gauge,
    histogram,
    in_flight,
    instrument,
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
from outrider.version import __version__

# name -> module: the middlewares are imported when first asked for (PEP 562), so that a training script that
# imports outrider loads no web-server code.
_LAZY = {"OutriderMiddleware": "outrider.hook.asgi", "OutriderWSGIMiddleware": "outrider.hook.wsgi"}


def prometheus_collector(registry: Any = None) -> Any:
    """Expose the hook's series through an existing prometheus_client registry (the default one when None): a
    service without a sidecar shows them on the /metrics it already serves. Imports prometheus_client then, only."""
    from outrider.prometheus_bridge import prometheus_collector as register

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

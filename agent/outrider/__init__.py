"""Outrider: monitoring for deep-learning training and inference.

    import outrider
    outrider.instrument()                       # publish to the agent (sidecar, `outrider run`) or run one
    for batch in outrider.dataloader(loader):   # measures the wait for each batch
        with outrider.step(samples=len(batch)): # times the step, counts samples
            ...

Importing this package is cheap and imports none of OpenTelemetry, prometheus_client, psutil, pynvml or torch.
"""

from __future__ import annotations

from outrider.hook.api import (
    count_samples,
    count_tokens,
    counter,
    dataloader,
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

__all__ = [
    "__version__",
    "count_samples",
    "count_tokens",
    "counter",
    "dataloader",
    "gauge",
    "histogram",
    "in_flight",
    "instrument",
    "latency",
    "phase",
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

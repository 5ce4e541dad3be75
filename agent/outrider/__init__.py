"""Outrider: monitoring for deep-learning training and inference.

Importing this package is cheap and imports none of OpenTelemetry, prometheus_client, psutil, pynvml or torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

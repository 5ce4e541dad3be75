"""Exporters: the Prometheus endpoint (prometheus.py) and OTLP push (otlp.py). Both read the sampler's latest
sweep; neither triggers collection."""

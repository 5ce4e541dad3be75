"""Adapters to what lies outside Outrider's code: the network (bounded outbound HTTP calls, gRPC unary calls on
h2, the HTTP server every listener of the agent's is), the GPU driver (nvml) and the workload's own metrics
libraries (the OpenTelemetry and prometheus_client bridges of the public API).

No imports here: each module has its own floor (pyproject.toml's layers), and importing one costs no other.
"""

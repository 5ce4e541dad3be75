"""outrider.prometheus_collector(): the hook's series on a service's own prometheus_client endpoint, no sidecar.

A real process: instrument(), steps, requests and custom series, its registry served by prometheus_client's own
HTTP server; the exposition is read back with prometheus_client's parser."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import free_port, reap, wait_until

SERVICE = r"""
import sys, time
import outrider
from prometheus_client import REGISTRY, Counter, start_http_server

port, done = int(sys.argv[1]), sys.argv[2]
outrider.instrument()
outrider.prometheus_collector()              # into prometheus_client's default registry
mine = Counter("shop_orders", "The service's own metric.")
for i in range(12):
    with outrider.step(samples=4):
        pass
    outrider.record_request(0.05 * (i % 3), route="/pay", status=200 if i % 4 else 503, method="POST")
    outrider.counter("shop_refunds_total", {"reason": "late"}).inc(2)
    mine.inc()
outrider.flush()                             # what a scrape shows is the last flush's
start_http_server(port, addr="127.0.0.1")
open(done, "w").close()
time.sleep(120)
"""


def test_the_hooks_series_show_on_the_services_own_endpoint(tmp_path: Path) -> None:
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    port, done = free_port(), tmp_path / "done"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env.update({"OUTRIDER_SPOOL_DIR": str(tmp_path / "spool"), "OUTRIDER_STANDALONE": "false",
                "OUTRIDER_FLUSH_INTERVAL_S": "3600"})
    proc = subprocess.Popen([sys.executable, str(script), str(port), str(done)], env=env)
    try:
        wait_until(done.exists, timeout_s=60, what="the service to serve")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        proc.kill()
        reap([proc])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("shop_orders_total", ())] == 12, "the service's own metrics are untouched"
    assert samples[("shop_refunds_total", (("reason", "late"),))] == 24
    assert samples[("outrider_train_steps_total", ())] == 12
    assert samples[("outrider_samples_total", ())] == 48
    pay = (("method", "POST"), ("route", "/pay"), ("scheme", ""))  # no scheme given: empty, as Prometheus reads absent
    ok = tuple(sorted((*pay, ("status_class", "2xx"), ("status_code", "200"))))
    failed = tuple(sorted((*pay, ("status_class", "5xx"), ("status_code", "503"))))
    assert samples[("outrider_requests_total", ok)] == 9 and samples[("outrider_requests_total", failed)] == 3
    # the latency histogram, cumulative buckets ending in +Inf = count, and its sum
    buckets = {dict(k[1])["le"]: v for k, v in samples.items()
               if k[0] == "outrider_request_duration_seconds_bucket" and dict(k[1])["status_code"] == "200"}
    assert buckets["+Inf"] == samples[("outrider_request_duration_seconds_count", ok)] == 9
    assert list(buckets.values()) == sorted(buckets.values()), "cumulative"
    assert buckets["0.05"] == 6 and buckets["0.025"] == 3  # 0.0 x3 (one 503), 0.05 x3, 0.1 x3 among the 200s
    assert abs(samples[("outrider_request_duration_seconds_sum", ok)] - (3 * 0.05 + 3 * 0.1)) < 1e-9


def test_importing_outrider_loads_no_prometheus_client() -> None:
    code = "import sys, outrider; print('prometheus_client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

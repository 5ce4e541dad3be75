"""The final OTLP export of a run or an agent that stops: bounded (one attempt, FINAL_EXPORT_BOUND_S) when the endpoint
is failing or was never reached, whatever otlp_timeout_s says, and named once when it fails: where to, why, how many.

An unreachable endpoint used to add the whole shutdown bound (5.4 s measured) to every `outrider run`, and nothing
said why. The bound is checked against the configured export timeout, which is made 30 s here: the old final export
waited out the SDK's retries within it (15 s and more); the new one does not come near it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from outrider.exporters.otlp import FINAL_EXPORT_BOUND_S, OtlpExporter
from outrider.ground.config import Config
from outrider.metrics.family import Family
from tests.helpers import AgentProcess, free_port, outrider_cmd, samples, value, wait_until
from tests.servers import OtlpHttpReceiver

pytestmark = pytest.mark.integration
EXPORT_TIMEOUT_S = 30.0
FAILED_LINE = re.compile(r"OTLP export to (\S+) failed: (.+) \((\d+) of (\d+) exports failed, the final one included\)")


@pytest.fixture(params=["closed", "silent"])
def unreachable(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(endpoint, the error the run must name): a port nothing listens on, or one that accepts connections (the
    kernel's backlog) and never answers."""
    if request.param == "closed":
        yield f"http://127.0.0.1:{free_port()}", "Connection refused"
        return
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", "no complete answer within 1 s"


def timed_run(env: dict[str, str]) -> tuple[float, str]:
    """`outrider run -- python -c pass`: its wall time and its stderr."""
    base = {"PATH": "/usr/bin:/bin", "HOME": env["HOME"], "PYTHONPATH": ":".join(sys.path)}
    t0 = time.monotonic()
    r = subprocess.run(outrider_cmd("run", "--quiet", "--", sys.executable, "-c", "pass"), env={**base, **env},
                       capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    return took, r.stderr


def test_a_run_with_an_unreachable_endpoint_ends_within_the_final_bound_and_says_so_once(
        unreachable: tuple[str, str], tmp_path: object) -> None:
    endpoint, error = unreachable
    common = {"HOME": str(tmp_path), "OUTRIDER_OTLP_TIMEOUT_S": str(EXPORT_TIMEOUT_S),
              "OUTRIDER_SHUTDOWN_TIMEOUT_S": "60", "OUTRIDER_LISTEN": "127.0.0.1:0"}
    with OtlpHttpReceiver() as receiver:  # what the run costs with an endpoint that takes the export
        reachable, quiet = timed_run({**common, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        assert receiver.requests and not FAILED_LINE.findall(quiet), quiet
    took, stderr = timed_run({**common, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    said = FAILED_LINE.findall(stderr)
    assert said == [(endpoint + "/v1/metrics", error, "1", "1")], stderr
    added = took - reachable
    print(f"the unreachable endpoint ({error}) added {added:.2f} s to the run ({added / EXPORT_TIMEOUT_S:.3f} "
          f"of otlp_timeout_s; {took:.2f} s against {reachable:.2f} s with a reachable one)")
    # the old final export waited out the SDK's retries within otlp_timeout_s (15 s and more here); the bound is
    # FINAL_EXPORT_BOUND_S, a thirtieth of it: a tenth leaves room for a loaded machine's noise
    assert added < EXPORT_TIMEOUT_S / 10


def test_an_agent_whose_exports_have_been_failing_stops_within_the_final_bound_and_counts_them() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "200",
           "OUTRIDER_OTLP_TIMEOUT_S": str(EXPORT_TIMEOUT_S), "OUTRIDER_SHUTDOWN_TIMEOUT_S": "60"}
    agent = AgentProcess(env=env, interval_s=0.25)
    try:
        def failures() -> float | None:
            return value(samples(agent.metrics()), "outrider_agent_otlp_exports_total", result="failure")

        wait_until(lambda: (failures() or 0) >= 2, timeout_s=60, what="two failed exports")
    finally:
        t0 = time.monotonic()
        code = agent.stop(timeout_s=120)
        took = time.monotonic() - t0
    assert code == 0
    said = FAILED_LINE.findall(agent.output)
    assert len(said) == 1, agent.output
    where, why, failed, attempts = said[0]
    assert (where, why) == (endpoint + "/v1/metrics", "Connection refused")
    assert int(failed) == int(attempts) >= 3, "the failures before and the final one"
    print(f"the agent stopped in {took:.2f} s ({took / EXPORT_TIMEOUT_S:.3f} of otlp_timeout_s)")
    assert took < EXPORT_TIMEOUT_S / 10


def test_the_final_export_waits_for_a_slow_endpoint_that_has_answered_and_not_for_one_that_never_has() -> None:
    """The bound follows what the endpoint did: the same slow answer (three final bounds late) gets through after
    a successful export, and is cut at the bound when no export ever got through. Counted, not timed."""
    fam = Family("outrider_agent_scrapes_total").add(1.0)
    with OtlpHttpReceiver() as receiver:
        answered = OtlpExporter(Config(otlp_endpoint=receiver.endpoint), lambda: [fam])
        assert answered.export_once()
        receiver.delay_s = 3 * FINAL_EXPORT_BOUND_S
        answered.shutdown(timeout_s=60)
        assert answered.results == {"success": 2}, answered.results

        never = OtlpExporter(Config(otlp_endpoint=receiver.endpoint), lambda: [fam])
        never.shutdown(timeout_s=60)
        assert never.results == {"deadline": 1}, never.results

"""The verdict fits what the process does, and the headline never contradicts the numbers under it: workloads whose
behaviour the test knows (it drives them and times them itself, or their work is fixed), under `outrider run`; each
run's summary (the counts, then `verdict: ...`) and its record are checked against what the workload did.

- a threaded WSGI service whose handlers call a downstream that answers in 50 ms, driven at 40 requests a second by
  a client in the test's own process (a client's CPU is not the service's): waiting, its mean latency within a
  fifth of the client's own timing, its CPU per request a small part of it;
- a FastAPI service under uvicorn (one event loop) awaiting a 200 ms downstream, at 17 requests a second: waiting;
- a training loop that calls a 30 ms remote service every step: waiting, at the line that calls it;
- four DataLoader workers decoding samples (CPU, no I/O), the job and two CPU hogs pinned to one CPU: input_bound,
  the workers starved of CPU, storage never named, the advice fewer workers or more CPUs;
- two DataLoader workers reading from a file on disk past the page cache (O_DIRECT): input_bound, storage named
  with the bytes read.

The services and the loop that waits run alone and beside a CPU hog (their verdicts judge CPU: a neighbour must not
turn waiting into anything else). Nothing reads a clock against a threshold: shares and ratios of the workload's own
timings.
"""

from __future__ import annotations

import mmap
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from outrider.diagnosis.bottleneck import STORAGE_READ, WAITING_SHARE
from outrider.runs.store import RunStore
from tests.diagnosis.traffic import Downstream, drive
from tests.helpers import outrider_cmd

# Each workload alone and beside a CPU hog: CI runs the hog half (the harder one, and a shared machine's case); the
# alone half is in the slow set (scripts/slow-tests.sh), for the time it takes
HOG = [pytest.param(False, id="alone", marks=pytest.mark.slow), pytest.param(True, id="beside_a_cpu_hog")]

pytestmark = pytest.mark.integration
SCRIPT = str(Path(__file__).with_name("behaviours.py"))
SECONDS = 10.0


@dataclass
class Run:
    text: str  # what `outrider run` printed
    verdict: dict[str, Any]  # the record's run verdict: cls, reason, evidence, seconds
    latencies: list[float]  # the client's own timing of each request, for a service

    @property
    def headline(self) -> str:
        return next(line for line in self.text.splitlines() if line.startswith("verdict: "))

    def measured(self, what: str) -> float:
        """The count the summary printed under `what the agent measured` ("steps", "requests"), 0 if none."""
        m = re.search(rf"^  (?:training|inference) +([\d,]+) {what}\b", self.text, re.MULTILINE)
        return float(m.group(1).replace(",", "")) if m else 0.0

    def line(self, topic: str) -> str:
        """A topic's text in the verdict block (`why`, `advice`), its wrapped lines joined."""
        block = self.text[self.text.index(self.headline):].splitlines()[1:]
        out: list[str] = []
        for row in block:
            if row[:13].strip() and out:
                break
            if row[:13].strip() == topic or out:
                out.append(row[13:].strip())
        return " ".join(out)


@contextmanager
def hogs(n: int, cpu: int | None = None) -> Iterator[None]:
    """n processes spinning, each on any CPU (or all on `cpu`): neighbours taking CPUs from the job."""
    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin) for _ in range(n)]
    try:
        yield
    finally:
        for s in spinners:
            s.kill()
            s.wait()


def run(tmp: Path, workload: str, *args: str, rate: float = 0.0, cpu: int | None = None,
        downstream: Downstream | None = None) -> Run:
    """One workload under `outrider run` in its own directories (pinned to one CPU where `cpu` is given); a service
    is driven at `rate` requests a second from this process until it exits."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")},
           "OUTRIDER_RUNS_DIR": str(tmp / "runs"), "OUTRIDER_SPOOL_DIR": str(tmp / "spool"),
           "OUTRIDER_STATE_DIR": str(tmp / "state"), "OUTRIDER_DIAGNOSIS_WINDOW_S": "4",
           "OUTRIDER_FLUSH_INTERVAL_S": "0.5"}
    port = tmp / "port"
    if rate:
        args = (str(port), *args)

    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    command = outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "1", "--", sys.executable, SCRIPT,
                           workload, str(SECONDS), *args)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pin)
    latencies: list[float] = []
    try:
        if rate:
            while proc.poll() is None and not (port.exists() and port.read_text()):
                time.sleep(0.1)
            if proc.poll() is None:
                latencies = drive(f"http://127.0.0.1:{port.read_text()}/lookup", rate, lambda: proc.poll() is None)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    store = RunStore(tmp / "runs")
    try:
        rec = store.load(store.list_runs()[-1][0])
    finally:
        store.close()
    return Run(err, dict(rec.summary["verdict"]), latencies)


def never_idle_above_work(r: Run) -> None:
    """The headline's first words against the counts printed above it; shown with `-s` (docs/diagnosis.md quotes
    these lines)."""
    ev = r.verdict["evidence"]
    client = f", client {statistics.mean(r.latencies) * 1e3:.1f} ms mean" if r.latencies else ""
    print(f"\n{r.measured('steps'):.0f} steps, {r.measured('requests'):.0f} requests{client}; {r.headline}\n"
          f"  why: {r.line('why')}\n  evidence: "
          + ", ".join(f"{k} {ev[k]:g}" for k in sorted(ev) if k.startswith(("request", "data_worker", "loop_wait",
                                                                             "storage", "io_pressure", "step_time"))))
    if r.measured("steps") or r.measured("requests"):
        assert not r.headline.startswith("verdict: idle"), r.text[-4000:]


@pytest.fixture(scope="module")
def downstream() -> Iterator[Downstream]:
    with Downstream() as d:
        yield d


@pytest.mark.parametrize("hog", HOG)
def test_a_wsgi_service_waiting_downstream_is_waiting(tmp_path: Path, downstream: Downstream, hog: bool) -> None:
    with hogs(1 if hog else 0):
        r = run(tmp_path, "wsgi_wait", downstream.url, rate=40.0)
    never_idle_above_work(r)
    assert r.measured("requests") > 0 and r.headline.startswith("verdict: waiting, "), r.text[-4000:]
    assert r.line("why").startswith("handlers wait: "), r.line("why")
    ev = r.verdict["evidence"]
    client = statistics.mean(r.latencies)
    # the service's mean latency is the client's, less the network's round trip on loopback and the client's own
    # wait for a CPU: within a fifth of it; and its CPU per request a small part of it
    assert 0.8 <= ev["request_latency_s"] / client <= 1.05, (ev["request_latency_s"], client)
    assert ev["request_cpu_s"] < 0.2 * ev["request_latency_s"], ev
    assert ev["request_waiting_fraction"] > WAITING_SHARE, ev
    assert "more of either will not help" in r.line("advice"), r.line("advice")


@pytest.mark.parametrize("hog", HOG)
def test_an_asyncio_service_waiting_downstream_is_waiting(tmp_path: Path, downstream: Downstream, hog: bool) -> None:
    pytest.importorskip("uvicorn")
    with hogs(1 if hog else 0):
        r = run(tmp_path, "asgi_wait", downstream.url, rate=17.0)
    never_idle_above_work(r)
    assert r.measured("requests") > 0 and r.headline.startswith("verdict: waiting, "), r.text[-4000:]
    ev = r.verdict["evidence"]
    assert 0.8 <= ev["request_latency_s"] / statistics.mean(r.latencies) <= 1.05, ev
    assert ev["request_cpu_s"] < 0.2 * ev["request_latency_s"], ev


@pytest.mark.parametrize("hog", HOG)
def test_a_loop_that_waits_on_the_network_is_waiting_at_that_line(tmp_path: Path, downstream: Downstream,
                                                                  hog: bool) -> None:
    pytest.importorskip("torch")
    with hogs(1 if hog else 0):
        r = run(tmp_path, "loop_wait", downstream.url)
    never_idle_above_work(r)
    assert r.measured("steps") > 0 and r.headline.startswith("verdict: waiting, "), r.text[-4000:]
    why = r.line("why")
    assert why.startswith("the loop waits outside the process") and "behaviours.py" in why, why
    ev = r.verdict["evidence"]
    # every step waits 30 ms for the remote service: the step is at least that, and mostly that
    assert ev["step_time_s"] >= 0.03 and ev["loop_waiting_fraction"] > WAITING_SHARE, ev
    assert "GPU" not in r.line("advice") and "CUDA" not in r.line("advice")


def test_a_loader_starved_of_cpu_is_said_so_and_storage_is_not_blamed(tmp_path: Path) -> None:
    """Four workers decoding, the loop and two CPU hogs on one CPU: the workers wait for a CPU far longer than they
    use one, and read nothing from storage."""
    pytest.importorskip("torch")
    cpu = min(os.sched_getaffinity(0))
    with hogs(2, cpu):
        r = run(tmp_path, "starved_loader", cpu=cpu)
    never_idle_above_work(r)
    assert r.headline.startswith("verdict: input_bound, "), r.text[-4000:]
    why, advice = r.line("why"), r.line("advice")
    assert "the DataLoader workers are starved of CPU" in why and "wait for storage" not in why, why
    assert "Fewer DataLoader workers" in advice and "more CPUs" in advice, advice
    assert "GPU" not in advice and "CUDA" not in advice, advice
    ev = r.verdict["evidence"]
    assert ev["data_workers_delay_cores"] > ev["data_workers_cpu_cores"], ev
    assert ev.get("storage_read_bytes_per_s", 0.0) < STORAGE_READ, ev


def direct_io(where: Path) -> bool:
    """Whether reads in `where` can bypass the page cache (O_DIRECT): tmpfs and some overlays refuse it."""
    probe = where / "probe"
    probe.write_bytes(b"\0" * 4096)
    buf = mmap.mmap(-1, 4096)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            return os.preadv(fd, [buf], 0) == 4096
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        probe.unlink()


def test_a_loader_reading_from_disk_waits_for_storage_named_with_its_reads(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if not direct_io(tmp_path):
        pytest.skip("the temporary directory's filesystem cannot bypass the page cache (O_DIRECT): reads there "
                    "never reach a disk")
    r = run(tmp_path, "disk_loader", str(tmp_path))
    never_idle_above_work(r)
    assert r.headline.startswith("verdict: input_bound, "), r.text[-4000:]
    why = r.line("why")
    assert "wait for storage" in why and "starved" not in why, why
    assert r.line("advice").startswith("Storage paces the loader"), r.line("advice")
    assert r.verdict["evidence"]["storage_read_bytes_per_s"] >= STORAGE_READ, r.verdict["evidence"]

"""CPU workloads with a known bottleneck under `outrider run` are classified correctly; their run records give an
HTML report (opened in headless Chromium: screenshot and DOM checked) and an A/B comparison; `outrider top` draws a
live agent's GPUs, KPIs and verdict."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from outrider.runs.report import dominant_verdict
from outrider.runs.store import RunStore
from tests.conftest import need_binary
from tests.gpu.conftest import Scenario
from tests.gpu.test_gpu_collector import FULL
from tests.helpers import REPO, AgentProcess, outrider_cmd, wait_until

pytestmark = pytest.mark.integration
WORKLOADS = str(Path(__file__).with_name("workloads.py"))
EXPECTED = {"starved": "input_bound", "compute": "compute_bound", "host": "host_bound"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Each workload run once under `outrider run`; returns the runs directory and workload -> run id."""
    pytest.importorskip("torch")
    runs = tmp_path_factory.mktemp("runs")
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    env = {**base, "OUTRIDER_RUNS_DIR": str(runs), "OUTRIDER_DIAGNOSIS_WINDOW_S": "5",
           "OUTRIDER_FLUSH_INTERVAL_S": "0.5"}
    ids = {}
    for name in EXPECTED:
        r = subprocess.run(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "1", "--", sys.executable,
                                        WORKLOADS, name, "14"), env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        line = next(line for line in r.stderr.splitlines() if line.strip().startswith("record"))
        ids[name] = line.split()[1].rstrip(":")
    return runs, ids


@pytest.mark.parametrize("workload", sorted(EXPECTED))
def test_known_bottlenecks_are_classified(recorded: tuple[Path, dict[str, str]], workload: str) -> None:
    runs, ids = recorded
    store = RunStore(runs)
    rec = store.load(ids[workload])
    assert dominant_verdict(rec) == EXPECTED[workload], rec.verdicts
    assert rec.values("process_cpu_cores") and rec.summary["exit_code"] == 0


def png_rows(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the raw scanlines of an 8-bit RGB(A) PNG, with the standard library only."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 4
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", data[:10])
            assert depth == 8
            channels = {2: 3, 6: 4}[color]
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for i in range(height):
        kind, line = raw[i * (stride + 1)], bytearray(raw[i * (stride + 1) + 1:(i + 1) * (stride + 1)])
        for x in range(stride):  # undo the PNG filter of the row
            a = line[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def has_color(rows: list[bytes], rgb: tuple[int, int, int], channels: int) -> bool:
    target = bytes(rgb)
    return any(row[x:x + 3] == target for row in rows for x in range(0, len(row), channels))


def test_report_opens_offline_in_headless_chromium(recorded: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    chromium = need_binary("chromium")
    runs, ids = recorded
    report = tmp_path / "report.html"
    r = subprocess.run(outrider_cmd("report", ids["starved"], "-o", str(report), "--runs-dir", str(runs)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text = report.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text, "opens offline"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert 'id="verdict"' in dom and "input_bound" in dom
    assert dom.count("<polyline") >= 4, "step time, throughput, data wait and CPU plots are drawn"
    assert "DataLoader workers" in dom
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", "--window-size=1000,1400", report.as_uri()],
                   capture_output=True, timeout=120)
    width, height, rows = png_rows(shot.read_bytes())
    assert (width, height) == (1000, 1400)
    assert len(set(rows)) > 100, "the page is drawn, not blank"
    channels = len(rows[0]) // width
    top = rows[: height // 4]
    assert has_color(top, (0x6A, 0x1B, 0x9A), channels), "the input_bound verdict badge is on screen, in its colour"
    assert has_color(rows, (0x15, 0x65, 0xC0), channels), "plot lines are drawn"


def test_compare_two_recorded_runs(recorded: tuple[Path, dict[str, str]]) -> None:
    runs, ids = recorded
    r = subprocess.run(outrider_cmd("compare", ids["compute"], ids["host"], "--runs-dir", str(runs)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "step time" in r.stdout and "95% CI" in r.stdout and "B is" in r.stdout
    missing = subprocess.run(outrider_cmd("report", "nope", "--runs-dir", str(runs)), capture_output=True, text=True)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_top_draws_gpus_kpis_and_verdict(fake_nvml: dict[str, str], scenario: Scenario, tmp_path: Path) -> None:
    scenario.write(FULL)
    spool, hold, rules = tmp_path / "spool", tmp_path / "hold", tmp_path / "extra.rules.yaml"
    rules.write_text("groups: [{name: extra, rules: [{alert: GPUsPresent, expr: 'count(outrider_gpu_up) > 0'}]}]\n")
    env = {"LD_LIBRARY_PATH": os.path.dirname(fake_nvml["full"]), "FAKE_NVML_SCENARIO": str(scenario.path),
           "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2", "OUTRIDER_DIAGNOSIS_WINDOW_S": "2"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    publisher = subprocess.Popen([sys.executable, str(REPO / "tests" / "dashboards" / "publisher.py"), str(hold)],
                                 env={**base, **env})
    try:
        with AgentProcess(env={**env, "OUTRIDER_RULE_FILES": f"builtin,{rules}", "OUTRIDER_RULE_INTERVAL_S": "0.3"},
                          interval_s=0.3) as agent:
            wait_until(lambda: "outrider_bottleneck" in agent.metrics(), timeout_s=30, what="a verdict")
            wait_until(lambda: 'outrider_alerts{alertname="GPUsPresent",alertstate="firing"' in agent.metrics(),
                       timeout_s=30, what="the extra rule firing in the agent")
            r = subprocess.run(outrider_cmd("top", "--url", agent.url, "--once", "--interval", "1"),
                               capture_output=True, text=True, timeout=60)
    finally:
        hold.write_text("x")
        publisher.wait(timeout=30)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert " GPU   util" in out and "87%" in out, out
    assert "steps/s" in out and "samples/s" in out
    assert "req/s" in out and "latency p50" in out
    assert "verdict    " in out
    assert re.search(r"alerts     .*GPUsPresent", out), out  # the agent's own alerts, as top reads them

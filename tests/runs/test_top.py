"""`outrider top` against a real agent (GPUs from the fake libnvidia-ml, standing in for the driver; a hooked
process publishing training and inference series): every screen fits the terminal's width, narrow or wide, and
the live view redraws in place (no screen clear, so no flicker) on a real pseudo-terminal of a given size."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu.conftest import Scenario
from tests.gpu.test_gpu_collector import FULL
from tests.helpers import REPO, AgentProcess, outrider_cmd, wait_until

pytestmark = pytest.mark.integration
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")


@pytest.fixture
def agent(fake_nvml: dict[str, str], scenario: Scenario, tmp_path: Path) -> Iterator[AgentProcess]:
    scenario.write(FULL)
    spool, hold, rules = tmp_path / "spool", tmp_path / "hold", tmp_path / "extra.rules.yaml"
    rules.write_text("groups: [{name: extra, rules: [{alert: GPUsPresent, expr: 'count(outrider_gpu_up) > 0'}]}]\n")
    env = {"LD_LIBRARY_PATH": os.path.dirname(fake_nvml["full"]), "FAKE_NVML_SCENARIO": str(scenario.path),
           "OUTRIDER_SPOOL_DIR": str(spool), "OUTRIDER_FLUSH_INTERVAL_S": "0.2", "OUTRIDER_DIAGNOSIS_WINDOW_S": "2"}
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    publisher = subprocess.Popen([sys.executable, str(REPO / "tests" / "dashboards" / "publisher.py"), str(hold)],
                                 env={**base, **env})
    try:
        with AgentProcess(env={**env, "OUTRIDER_RULE_FILES": f"builtin,{rules}", "OUTRIDER_RULE_INTERVAL_S": "0.3",
                               "OUTRIDER_STATE_DIR": str(tmp_path / "state")}, interval_s=0.3) as a:
            wait_until(lambda: "outrider_bottleneck" in a.metrics(), timeout_s=30, what="a verdict")
            wait_until(lambda: 'outrider_alerts{alertname="GPUsPresent",alertstate="firing"' in a.metrics(),
                       timeout_s=30, what="the extra rule firing in the agent")
            yield a
    finally:
        hold.write_text("x")
        publisher.wait(timeout=30)


def top_once(url: str, columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50"}
    r = subprocess.run(outrider_cmd("top", "--url", url, "--once", "--interval", "1"), env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_screen_fits_the_terminal_width_and_keeps_what_matters(agent: AgentProcess) -> None:
    wide = top_once(agent.url, 160)
    assert re.search(r"\n0 +87% +\S+ +40 GiB / 80 GiB +\d+ °C +\d+ W", wide), wide  # GPU 0 of the fake
    assert re.search(r"training +[\d.,]+ steps/s +[\d.,]+ samples/s", wide), wide
    assert re.search(r"step time p50 [\d.]+ ms +p99 [\d.]+ ms", wide), wide
    assert re.search(r"inference +[\d.,]+ req/s +latency p50 [\d.]+ ms +p90 [\d.]+ ms +p99 [\d.]+ ms", wide), wide
    assert re.search(r"host +cpu \d+(\.\d)?% +job rss [\d.,]+ [KMG]iB +memory available", wide), wide
    assert re.search(r"verdict +\w+", wide) and re.search(r"alerts +.*GPUsPresent", wide), wide
    for columns in (40, 60, 100, 160):
        screen = top_once(agent.url, columns)
        widths = [len(line) for line in screen.splitlines()]
        assert max(widths) <= columns, (columns, screen)
        assert re.search(r"\n0 +87%", screen), (columns, screen)  # the GPU and its utilisation survive narrowing
        assert re.search(r"verdict +\w+", screen) and "alerts" in screen, (columns, screen)
        if columns < 100:
            assert "…" in screen, "what does not fit is cut visibly"


def test_the_live_view_redraws_in_place_at_the_terminals_size(agent: AgentProcess) -> None:
    rows, columns = 30, 72
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    proc = subprocess.Popen(outrider_cmd("top", "--url", agent.url, "--interval", "0.3"), stdin=slave, stdout=slave,
                            stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while out.count(b"outrider top") < 3 and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                out += os.read(master, 1 << 16)
        proc.send_signal(signal.SIGINT)
        # read on while it ends: a full pty would hold its last writes (leaving the alternate screen) and it with them
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 1 << 16)
                except OSError:  # the pty closed with the process
                    chunk = b""
                out += chunk
                if chunk:
                    continue
            if proc.poll() is not None:
                break
        assert proc.wait(timeout=1) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = out.decode(errors="replace")
    assert text.count("outrider top") >= 3, "three screens drawn"
    assert "\x1b[?1049h" in text and text.rstrip().endswith("\x1b[?1049l"), "the alternate screen, left on exit"
    assert "\x1b[2J" not in text and "\x1b[J" not in text, "never cleared: each screen overwrites the last"
    frames = text.split("\x1b[H")[2:]  # every screen starts at the home position
    assert len(frames) >= 3
    for frame in frames:
        lines = ANSI.sub("", frame).split("\r\n")
        assert len(lines) <= rows and max(len(line) for line in lines) <= columns, lines
        assert any(re.match(r"0 +87%", line) for line in lines)

"""A real run, end to end: the demo's workload (training with a DataLoader, a slowdown on purpose, then an
inference service with some malformed requests) under `outrider run` with the demo's alert rule, its records
and state in this test's temporary directories. Its summary ends with the verdict after what the agent measured;
its HTML report, opened in headless Chromium, shows the alert that fired and resolved, charts with axes, ticks
and units where the screenshot has them, and human numbers only; `outrider compare` prints every KPI in human
units with its sample counts."""

from __future__ import annotations

import html.parser
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from outrider.diagnosis.bottleneck import CLASSES
from outrider.runs.kpis import KPIS
from outrider.runs.measured import Measured
from outrider.runs.report import COLORS
from tests.conftest import need_binary
from tests.helpers import REPO, outrider_cmd
from tests.runs.jobs import assert_printed_in_human_units

pytestmark = pytest.mark.integration
DEMO_RULES = REPO / "agent" / "outrider" / "commands" / "demo" / "rules.yaml"
WINDOW = (1240, 3600)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={WINDOW[0]},{WINDOW[1]}"]
# a raw float: four significant digits or more after the point (units.number gives two below 1: 0.56, 0.0088)
LONG_FLOAT = re.compile(r"\d+\.0*[1-9]\d{3,}")

# Run in the page by a copy of the report (the report itself has no script): where Chromium laid out the verdict
# badge and every chart's axes and lines, in screen pixels, for the screenshot of the report to be checked against.
PROBE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
const at = (el, x, y) => { const p = new DOMPoint(x, y).matrixTransform(el.getScreenCTM()); return [p.x, p.y]; };
const charts = [...document.querySelectorAll('section.plot')].map(sec => {
  const svg = sec.querySelector('svg');
  const series = [...svg.querySelectorAll('.series')].map(el => {
    const pts = [];
    if (el.tagName === 'polyline') {
      for (let i = 0; i < el.points.numberOfItems; i++) {
        const p = el.points.getItem(i); pts.push(at(el, p.x, p.y));
      }
    } else { pts.push(at(el, el.cx.baseVal.value, el.cy.baseVal.value)); }
    return {color: el.getAttribute('stroke') || el.getAttribute('fill'), points: pts};
  });
  const ends = a => [at(a, a.x1.baseVal.value, a.y1.baseVal.value), at(a, a.x2.baseVal.value, a.y2.baseVal.value)];
  return {title: sec.dataset.title, series: series, x_axis: ends(svg.querySelector('line.axis.x')),
          y_axis: ends(svg.querySelector('line.axis.y'))};
});
document.documentElement.setAttribute('data-probe', JSON.stringify(
  {verdict: box(document.getElementById('verdict')), charts: charts}));
</script>"""


@dataclass
class Recorded:
    tmp: Path
    runs: Path
    run_id: str
    stderr: str
    summary: dict[str, Any]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    tmp = tmp_path_factory.mktemp("demo-run")
    runs, summary = tmp / "runs", tmp / "summary.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env = {**base, "OUTRIDER_RUNS_DIR": str(runs), "OUTRIDER_STATE_DIR": str(tmp / "state"),
           "OUTRIDER_RULE_FILES": str(DEMO_RULES), "OUTRIDER_RULE_INTERVAL_S": "0.5",
           "OUTRIDER_DIAGNOSIS_WINDOW_S": "3", "OUTRIDER_FLUSH_INTERVAL_S": "0.25", "OUTRIDER_ALERT_INSTANCE": "demo"}
    r = subprocess.run(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "0.5", "--summary-json",
                                    str(summary), "--", sys.executable, "-m", "outrider.commands.demo.workload",
                                    "--train-seconds", "8", "--serve-seconds", "4", "--checkpoint-dir", str(tmp)),
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    data = json.loads(summary.read_text())
    assert (runs / "runs.db").exists() and data["run_id"]
    return Recorded(tmp, runs, data["run_id"], r.stderr, data)


def summary_text(stderr: str) -> str:
    return stderr[stderr.rindex("outrider: "):]


def test_the_summary_ends_with_the_verdict_and_its_evidence_after_what_was_measured(demo_run: Recorded) -> None:
    text = summary_text(demo_run.stderr)
    measured, verdict = text.index("\nwhat the agent measured:\n"), text.index("\nverdict: ")
    assert measured < verdict
    training = re.search(r"\n  training   ([\d,]+) steps, [\d.,]+ steps/s, step time p50 [\d.]+ ms, p99 [\d.]+ ms, "
                         r"([\d,]+) samples/s, [\d,]+ tokens/s\n", text)
    steps = demo_run.summary["measured"]["training"]["steps"]
    assert training and int(training.group(1).replace(",", "")) == steps > 5, text
    assert re.search(r"\n {13}data-loader wait p50 [\d.]+ (ms|µs), [\d.]+% of the loop waiting for data\n", text)
    inference = re.search(r"\n  inference  ([\d,]+) requests on /predict/\{model\}, latency p50 [\d.]+ (ms|µs), "
                          r"p90 [\d.]+ (ms|µs), p99 [\d.]+ (ms|µs); ([\d,]+) errors \(([\d,]+) 4xx, 0 5xx\)", text)
    assert inference and int(inference.group(5)) > 0, text  # the workload sends ~2% malformed requests
    # (the line may wrap)
    assert re.search(r"\n  alerts     DemoStepTimeRegression \(warning\)\s+(pending\s+at\s+0:\d\d,\s+)?"
                     r"fired\s+at\s+0:\d\d,\s+resolved\s+at\s+0:\d\d\s+after\s+[\d.]+\s+s:\s+"
                     r"Training\s+steps\s+on\s+demo\s+take", text), text
    # the verdict block is the last thing printed: the verdict, why, its evidence, the timeline, the advice
    block = text[verdict + 1:].rstrip("\n").splitlines()
    v = demo_run.summary["verdict"]
    assert v["cls"] in CLASSES and v["cls"] != "idle"
    assert block[0].startswith(f"verdict: {v['cls']}, ") and "of the" in block[0] and "the job was active" in block[0]
    topics = [line[:13].strip() for line in block[1:] if line[:13].strip()]
    assert topics == ["why", "evidence", "timeline", "advice"], block
    assert all(line.startswith(("  ", "verdict: ")) for line in block)
    assert "step time" in text[verdict:] and "job CPU" in text[verdict:]
    assert not LONG_FLOAT.search(text), LONG_FLOAT.findall(text)
    assert {a["name"] for a in demo_run.summary["alerts"]} == {"DemoStepTimeRegression"}


def test_a_command_without_the_hook_still_gets_the_measured_section_and_a_verdict(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_"))}
    env = {**base, "OUTRIDER_RUNS_DIR": str(tmp_path / "runs"), "OUTRIDER_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run(outrider_cmd("run", "--listen", "127.0.0.1:0", "--interval", "0.3", "--", sys.executable, "-c",
                                    "import time; time.sleep(1.5)"), env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    text = summary_text(r.stderr)
    assert "\nwhat the agent measured:\n  hook       nothing: no process of the command called outrider.instrument()" \
           in text
    last = text.rstrip("\n").splitlines()
    verdict = next(i for i, line in enumerate(last) if line.startswith("verdict: "))
    assert verdict > last.index("what the agent measured:")
    assert last[verdict].startswith(("verdict: idle", "verdict: none", "verdict: balanced")), last[verdict]
    assert (tmp_path / "runs" / "runs.db").exists()


class TextNodes(html.parser.HTMLParser):
    """The text a person sees (and tooltips), without markup or attribute values."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag in ("style", "script")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("style", "script")

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.texts.append(data.strip())


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([need_binary("chromium"), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def near(img: Image.Image, x: float, y: float, rgb: tuple[int, int, int], radius: int = 2, tol: int = 40) -> bool:
    for dx in range(-radius, radius + 1):
        for dy in range(-radius, radius + 1):
            px, py = round(x) + dx, round(y) + dy
            if 0 <= px < img.width and 0 <= py < img.height:
                got = img.getpixel((px, py))
                if all(abs(a - b) <= tol for a, b in zip(got[:3], rgb)):  # type: ignore[index]
                    return True
    return False


def rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def test_the_report_in_headless_chromium(demo_run: Recorded, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    r = subprocess.run(outrider_cmd("report", demo_run.run_id, "-o", str(report), "--runs-dir", str(demo_run.runs)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    page = report.read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page, "opens offline, no script"
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = chromium("--dump-dom", probe.as_uri(), profile=tmp_path / "profile-dom").stdout
    layout = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))  # type: ignore[union-attr]

    # what it says: the run's verdict, the alert that fired and resolved, human numbers only
    verdict = demo_run.summary["verdict"]["cls"]
    assert re.search(rf'id="verdict"[^>]*>{verdict}<', dom)
    texts = TextNodes()
    texts.feed(dom)
    visible = "\n".join(texts.texts)
    assert re.search(r"DemoStepTimeRegression \(warning\) (pending at 0:\d\d, )?fired at 0:", visible)
    assert "resolved at 0:" in visible
    assert "No alert fired" not in visible and "no stall or alert" not in visible
    raw_keys = [k for k in (*KPIS, "wall_s", "peak_tree_rss_bytes", "cpu_user_s") if k in visible]
    assert raw_keys == [] and not LONG_FLOAT.search(visible), (raw_keys, LONG_FLOAT.findall(visible))
    measured = Measured.from_json(demo_run.summary["measured"]).rows()
    topics = [topic for topic, _ in measured]  # a record's first line names it, its further lines do not
    assert topics[0] == "training" and topics[-1] == "inference" and set(topics[1:-1]) == {""}, topics
    assert all(text in summary_text(demo_run.stderr) and text in visible for _, text in measured)
    assert re.search(r"ran for\n[\d.]+ s\n", visible) and re.search(r"peak memory \(RSS\)\n[\d.]+ MiB", visible)

    # the charts: the run's RSS, requests and errors among them, each with ticks on both axes and its unit
    charts = {c["title"]: c for c in layout["charts"]}
    assert {"Step time", "Throughput", "Data wait", "Job CPU", "Memory (RSS)", "Requests", "Errors",
            "Request latency"} <= set(charts), set(charts)
    sections = re.findall(r'<section class="plot" data-title="([^"]+)">(.*?)</section>', dom, re.S)
    units_of = {"Step time": "ms", "Throughput": "samples/s", "Memory (RSS)": "MiB", "Requests": "req/s",
                "Errors": "errors/s", "Data wait": "%", "Job CPU": "cores"}
    for title, body in sections:
        assert len(re.findall(r'class="tick-label y"', body)) >= 3, title
        assert len(re.findall(r'class="tick-label x"', body)) >= 2, title
        assert re.search(r'class="tick-label x"[^>]*>0:00<', body), title
        assert 'class="axis x"' in body and 'class="axis y"' in body and "run time (m:ss)" in body, title
        if title in units_of:
            assert re.search(rf'class="axis-title y"[^>]*>{re.escape(units_of[title])}<', body), title

    # the screenshot: drawn, and the badge, axes and lines are where the layout says
    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", report.as_uri(), profile=tmp_path / "profile-shot")
    img = Image.open(shot).convert("RGB")
    assert img.size == WINDOW
    assert len(img.getcolors(maxcolors=1 << 20) or []) > 50, "the page is drawn, not blank"
    x, y, w, h = layout["verdict"]
    assert w > 40 and h > 20
    assert near(img, x + 3, y + h / 2, rgb(COLORS[verdict]), radius=1, tol=8), "the verdict badge, in its colour"
    for title, chart in charts.items():
        (yx, top_y), (_, bottom_y) = chart["y_axis"]
        assert bottom_y < WINDOW[1], f"{title}: below the screenshot (the window must hold the whole report)"
        (left_x, axis_y), (right_x, _) = chart["x_axis"]
        assert abs(yx - left_x) < 1 and abs(bottom_y - axis_y) < 1, "the axes meet at the origin"
        assert all(near(img, yx, top_y + (bottom_y - top_y) * f, rgb("#777777"), radius=1, tol=8)
                   for f in (0.1, 0.5, 0.9)), f"{title}: the y axis is drawn"
        assert near(img, left_x + 2, axis_y, rgb("#777777"), radius=1, tol=8), f"{title}: the x axis is drawn"
        top = chart["series"][-1]  # drawn last: on top of the others
        hits = [near(img, px, py, rgb(top["color"])) for px, py in top["points"]]
        assert sum(hits) >= 0.9 * len(hits), (title, sum(hits), len(hits))
        assert all(left_x <= px <= right_x + 1 and top_y - 1 <= py <= axis_y + 1 for px, py in top["points"]), \
            f"{title}: the line stays inside its axes"


def test_compare_prints_every_statistic_in_human_units_with_what_it_stands_on(demo_run: Recorded) -> None:
    r = subprocess.run(outrider_cmd("compare", demo_run.run_id, demo_run.run_id, "--runs-dir", str(demo_run.runs)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert_printed_in_human_units(r.stdout)
    compared = r.stdout.partition("\nnot compared:\n")[0]
    lines = [line.strip() for line in compared.splitlines() if line.startswith("  ")]
    labels = {line.split(":")[0] for line in lines}
    assert {"step time mean", "throughput", "data wait", "request rate", "client errors (4xx)",
            "client errors (4xx) per request", "job CPU", "job memory (RSS)"} <= labels, labels
    assert labels & {"p99 latency", "request latency p99"}, "per sweep from classic buckets, or step by step"
    for line in lines:
        assert "no significant difference" in line, "a run against itself"
    assert re.search(r"job memory \(RSS\): A [\d.]+ MiB, B [\d.]+ MiB", r.stdout)
    assert re.search(r"step time mean: A [\d.]+ ms, B [\d.]+ ms", r.stdout)
    assert not LONG_FLOAT.search(r.stdout)
    missing = subprocess.run(outrider_cmd("report", "nope", "--runs-dir", str(demo_run.runs)), capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr

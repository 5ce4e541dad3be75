"""A fleet simulated on one machine: a real Prometheus scraping `outrider agent`s of fake 8-GPU nodes, each with a
hooked training and inference workload, with the alert catalog loaded in Prometheus; measured, then extrapolated to
100, 1,000 and 10,000 GPU nodes.

Not a test: it prints figures (and writes them as JSON with --json). What each simulated node is:
- `outrider agent` on the defaults, as a node agent or sidecar runs it, except `rule_files` empty (Prometheus
  alerts, the agent does not), watching its node's process tree, sweeping at the scrape interval;
- 8 GPUs from the fake libnvidia-ml (tests/fakes/fake_nvml.c), H100-like, their readings drifting every interval,
  each running one rank's process;
- benchmarks/fleet_workload.py: 8 training ranks (separate processes, one per GPU, 4 nodes to a training job) and an
  inference server (two routes) publishing through the hook into the node's own spool.
Every agent sees the same host (this machine's CPUs, disks, interfaces), and the network is loopback.

Method. The rules read far back (SLO burn rates over 6 hours, baselines over a day): a fresh Prometheus would
evaluate them over almost nothing. So before Prometheus starts, every series that a range or offset selector of the
rule file reads further back than the warm-up is backfilled (promtool tsdb create-blocks-from openmetrics) over that
selector's reach: the agents' series at the scrape interval, counters at the rates the agents show, gauges at their
value; the recorded series at their group's interval, with the labels and values a probe Prometheus (run for a few
evaluations, then removed) recorded. Rule evaluation is then measured over full windows.
Prometheus starts with all agents as targets and itself; after a warm-up the run alternates phases with the rule
file loaded and without it (/-/reload), so that the rules' share of Prometheus's CPU is a difference within one run.

    python benchmarks/fleet_sizing.py [--nodes 32] [--interval 15] [--warmup-min 5] [--phase-min 3] [--json out.json]
    python benchmarks/fleet_sizing.py --quick     # does it run? (8 nodes, short phases: not the figures to quote)

The full run takes about 22 minutes on 2 cores (the warm-up and four 3-minute phases are most of it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "agent"))

from tests.fakes.build import build  # noqa: E402

from benchmarks.gpu_sweep import GPU  # noqa: E402

RULES = REPO / "alerts" / "outrider.rules.yaml"
WORKLOAD = REPO / "benchmarks" / "fleet_workload.py"
# What Prometheus 2.42 sends on a scrape: the agent answers OpenMetrics, gzipped.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
NODES_PER_JOB = 4
SIZES = (100, 1_000, 10_000)
# The limits one Prometheus server is held to when sizing (stated in the output): a 64 GiB machine with half of it
# for the head (the rest: queries, compaction, page cache of the blocks), and every rule group done within half of
# its evaluation interval (past the whole interval, iterations are skipped: alerts go late or never fire).
HEAD_MEMORY_BUDGET_BYTES = 32 * 2**30
RULE_TIME_BUDGET = 0.5
MIB = 2**20


# --- processes and the machine --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return 0.0
    f = text[text.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid: int) -> int:
    """Proportional set size: forked ranks share their interpreter's pages, RSS would count them once each."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def meminfo_kib(key: str) -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def loadavg() -> float:
    with open("/proc/loadavg") as fh:
        return float(fh.read().split()[0])


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / tick, sum(f[:8]) / tick


def http_get(url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> tuple[int, bytes, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def wait_until(check: Any, timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if result:
                return result
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class Processes:
    """Every process this benchmark starts, each in its own session (a Ctrl-C reaches only the benchmark, which
    stops them in order), stopped by process id: SIGTERM, then SIGKILL for what has not gone after a grace period."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.extra: list[tuple[int, str]] = []  # (pid, a word of its command line): forked by a started process

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def adopt(self, pid: int, marker: str) -> None:
        """A grandchild (a forked rank): killed only if /proc still shows `marker` in its command line, so a pid
        reused by someone else's process is never touched."""
        self.extra.append((pid, marker))

    def stop_all(self, grace_s: float = 20.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        while any(_is(pid, marker) for pid, marker in self.extra) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid, marker in self.extra:
            if _is(pid, marker):
                os.kill(pid, signal.SIGKILL)


def _is(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return marker.encode() in fh.read()
    except OSError:
        return False


# --- the simulated nodes --------------------------------------------------------------------------------------


@dataclass
class Node:
    index: int
    dir: Path
    port: int
    launcher: subprocess.Popen[bytes]
    agent: subprocess.Popen[bytes] | None = None
    ranks: list[int] = field(default_factory=list)  # pids, one per GPU
    others: list[int] = field(default_factory=list)  # the inference server

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pids(self) -> list[int]:
        return [p.pid for p in (self.launcher, self.agent) if p is not None] + self.ranks + self.others


def scenario(node: Node, gpus: int, rng: random.Random) -> str:
    """The fake driver's view of the node: H100-like GPUs, each busy with one rank, readings drifting a little
    every interval as a real GPU's do (the TSDB compresses a constant far better than a real reading)."""
    text = [f"device_count {gpus}"]
    for i in range(gpus):
        pid = node.ranks[i] if i < len(node.ranks) else 0
        gpu = GPU.format(i=i, pid=pid).replace(f"uuid GPU-{i:08d}", f"uuid GPU-{node.index:04d}-{i:04d}")
        drift = {
            "util_gpu": rng.randint(80, 99), "util_mem": rng.randint(30, 60), "temp": rng.randint(60, 78),
            "power_mw": rng.randint(550_000, 690_000), "clock_sm": rng.choice((1755, 1770, 1785, 1980)),
            "memory_used": 42949672960 + rng.randrange(1 << 30), "pcie_tx_kbps": rng.randint(500, 5000),
            "pcie_rx_kbps": rng.randint(500, 5000),
        }
        lines = []
        for line in gpu.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[2] in drift:
                line = f"gpu {i} {parts[2]} {drift[parts[2]]}"
            elif len(parts) == 4 and parts[2] == "energy_mj":
                line = f"gpu {i} energy_mj {987654321 + int(time.time() * 600_000)}"
            if pid == 0 and parts[2] == "proc":
                continue
            lines.append(line)
        text.extend(lines)
    return "\n".join(text) + "\n"


def write_scenario(node: Node, gpus: int, rng: random.Random) -> None:
    """Atomically (rename): the fake re-reads the file when it changes and must never see half of it."""
    tmp = node.dir / "scenario.tmp"
    tmp.write_text(scenario(node, gpus, rng))
    os.replace(tmp, node.dir / "scenario.txt")


def base_env(work: Path) -> dict[str, str]:
    """The environment of every started process: no OUTRIDER_ or OTEL_ settings from the caller, this checkout's
    package first on the path, and home, data, state and cache inside the benchmark's own directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTRIDER_", "OTEL_", "XDG_"))}
    home = work / "home"
    for sub in ("", "data", "state", "cache", "runtime"):
        (home / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_STATE_HOME=str(home / "state"),
               XDG_CACHE_HOME=str(home / "cache"), XDG_RUNTIME_DIR=str(home / "runtime"),
               PYTHONPATH=os.pathsep.join([str(REPO / "agent"), str(REPO)]))
    return env


def start_node(k: int, args: argparse.Namespace, work: Path, lib: str, procs: Processes,
               rng: random.Random) -> Node:
    d = work / f"node-{k:03d}"
    (d / "spool").mkdir(parents=True, mode=0o700)
    env = base_env(work)
    workload_env = {**env, "OUTRIDER_SPOOL_DIR": str(d / "spool"), "OUTRIDER_STANDALONE": "false",
                    "OUTRIDER_FLUSH_INTERVAL_S": str(args.flush_interval)}
    job, first = f"llm-pretrain-{k // NODES_PER_JOB:03d}", (k % NODES_PER_JOB) * args.ranks
    launcher = procs.start([sys.executable, str(WORKLOAD), "--ranks", str(args.ranks), "--job", job,
                            "--first-rank", str(first), "--world", str(NODES_PER_JOB * args.ranks),
                            "--step-s", str(args.step_s), "--request-s", str(args.request_s),
                            "--pids", str(d / "pids"), "--hold", str(d / "hold")],
                           workload_env, d / "workload.log")
    node = Node(k, d, free_port(), launcher)
    wait_until(lambda: (d / "pids").exists() or launcher.poll() is not None, 60, f"node {k}'s workload")
    if launcher.poll() is not None:
        raise RuntimeError(f"node {k}'s workload exited: {(d / 'workload.log').read_text()[-2000:]}")
    for line in (d / "pids").read_text().splitlines():
        role, _, pid = line.split()
        (node.ranks if role == "rank" else node.others).append(int(pid))
        procs.adopt(int(pid), "fleet_workload.py")
    write_scenario(node, args.gpus, rng)
    agent_env = {**env, "OUTRIDER_SPOOL_DIR": str(d / "spool"), "OUTRIDER_STATE_DIR": str(d / "state"),
                 "OUTRIDER_NVML_LIBRARY": lib, "FAKE_NVML_SCENARIO": str(d / "scenario.txt"),
                 "OUTRIDER_RULE_FILES": ""}
    node.agent = procs.start([sys.executable, "-m", "outrider", "agent", "--listen", node.target,
                              "--interval", str(args.interval), "--pid", str(launcher.pid)],
                             agent_env, d / "agent.log")
    return node


def agent_ready(node: Node) -> bool:
    assert node.agent is not None
    if node.agent.poll() is not None:
        raise RuntimeError(f"node {node.index}'s agent exited: {(node.dir / 'agent.log').read_text()[-2000:]}")
    return http_get(f"http://{node.target}/readyz", timeout_s=2)[0] == 200


def fetch(node: Node, accept: str = PROMETHEUS_ACCEPT) -> tuple[int, int, str]:
    """(compressed bytes, uncompressed bytes, body) of one scrape, by default as Prometheus asks for it."""
    status, body, headers = http_get(f"http://{node.target}/metrics", timeout_s=10,
                                     headers={"Accept": accept, "Accept-Encoding": "gzip"})
    if status != 200:
        raise RuntimeError(f"node {node.index}: /metrics answered {status}")
    raw = gzip.decompress(body) if headers.get("Content-Encoding") == "gzip" else body
    return len(body), len(raw), raw.decode()


# --- backfill of the rules' windows ---------------------------------------------------------------------------


@dataclass
class Selector:
    name: str
    matchers: list[Any]
    reach_ms: int  # range + offset (+ the 5-minute lookback of an instant selector)


def rule_file() -> tuple[list[Selector], dict[str, tuple[str, float]]]:
    """(every selector of the rule file, {recorded name: (its expression, its group's interval in s)})."""
    import promql_parser as pp
    import yaml

    from outrider.rules.promql import selector_name, selectors

    doc = yaml.safe_load(RULES.read_text())
    recorded = {}
    found = []
    for group in doc["groups"]:
        interval_s = _seconds(group.get("interval"))
        for rule in group["rules"]:
            if "record" in rule:
                recorded[rule["record"]] = (rule["expr"], interval_s)
            for vs, reach_ms in selectors(pp.parse(rule["expr"])):
                name = selector_name(vs)
                if name is not None:
                    found.append(Selector(name, [m for m in vs.matchers.matchers if m.name != "__name__"], reach_ms))
    return found, recorded


def _seconds(duration: str | None) -> float:
    """A Prometheus duration of one unit ("30s", "1m"); None: the global interval, filled in by the caller."""
    if not duration:
        return 0.0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    for unit in ("ms", "s", "m", "h", "d"):
        if duration.endswith(unit) and duration[: -len(unit)].isdigit():
            return int(duration[: -len(unit)]) * units[unit]
    raise ValueError(f"duration {duration!r}")


def _matches(matchers: list[Any], labels: dict[str, str]) -> bool:
    import re

    import promql_parser as pp

    for m in matchers:
        value = labels.get(m.name, "")
        if m.op == pp.MatchOp.Equal and value != m.value:
            return False
        if m.op == pp.MatchOp.NotEqual and value == m.value:
            return False
        if m.op == pp.MatchOp.Re and not re.fullmatch(m.value, value):
            return False
        if m.op == pp.MatchOp.NotRe and re.fullmatch(m.value, value):
            return False
    return True


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, bool]]:
    """{(name, labels): (value, is a counter)} from a text exposition (0.0.4)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        counter = fam.type in ("counter", "histogram", "summary")
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = (s.value, counter)
    return out


TEXT_FORMAT = "text/plain;version=0.0.4"
Labels = tuple[tuple[str, str], ...]


def probe_recorded(binary: str, work: Path, nodes: list[Node], interval_s: int, procs: Processes,
                   recorded: dict[str, tuple[str, float]]) -> dict[str, list[tuple[Labels, float]]]:
    """{recorded name: [(labels, value)]}: what the recording rules produce over these nodes, from a probe
    Prometheus run for a few evaluations and removed. A recorded series that needs history to appear (a baseline
    over an hour) gets the labels and value of the recorded series it is computed from: the catalog's baselines
    (avg_over_time, max_over_time, min_over_time of a recorded series) keep its labels."""
    import promql_parser as pp

    from outrider.rules.promql import selector_name, selectors

    probe = Prometheus(binary, work / "probe", [n.target for n in nodes], interval_s, procs)
    found: dict[str, list[tuple[Labels, float]]] = {}
    try:
        deadline = time.monotonic() + 4 * max(interval_s, *(i for _, i in recorded.values())) + 30
        stable_since, last = time.monotonic(), -1
        while time.monotonic() < deadline:
            for name in recorded:
                result = probe.query(f'{{__name__="{name}"}}')
                if result:
                    found[name] = [(tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")),
                                    float(r["value"][1])) for r in result]
            if len(found) != last:
                stable_since, last = time.monotonic(), len(found)
            elif time.monotonic() - stable_since > 2 * max(i for _, i in recorded.values()):
                break
            time.sleep(5)
    finally:
        probe.proc.terminate()
        probe.proc.wait(timeout=30)
        shutil.rmtree(work / "probe", ignore_errors=True)

    def derive(name: str, depth: int = 0) -> list[tuple[Labels, float]]:
        if name in found or depth > len(recorded):
            return found.get(name, [])
        for vs, _ in selectors(pp.parse(recorded[name][0])):
            base = selector_name(vs)
            if base in recorded and base != name and derive(base, depth + 1):
                found[name] = found[base]
                return found[name]
        return []

    for name in recorded:
        derive(name)
    return found


def backfill(nodes: list[Node], interval_s: int, data_dir: Path, work: Path, warmup_s: float,
             recorded_series: dict[str, list[tuple[Labels, float]]],
             recorded: dict[str, tuple[str, float]]) -> dict[str, Any]:
    """Blocks in Prometheus's data directory holding, for every series a long range or offset selector reads,
    its history over that reach: counters growing at the rate the agent shows now, gauges and recorded series at
    their value now (at their group's interval), and `up` at 1."""
    all_selectors, _ = rule_file()
    # what the warm-up and the 5-minute lookback cover needs no history
    wanted = [sel for sel in all_selectors if sel.reach_ms > max(warmup_s, 300) * 1000]
    first = {n.index: parse_exposition(fetch(n, TEXT_FORMAT)[2]) for n in nodes}
    t1 = time.time()
    time.sleep(interval_s + 1)  # one sweep later: each counter's rate
    second = {n.index: parse_exposition(fetch(n, TEXT_FORMAT)[2]) for n in nodes}
    t2 = time.time()

    def reach(name: str, labels: dict[str, str]) -> int:
        return max((sel.reach_ms for sel in wanted if sel.name == name and _matches(sel.matchers, labels)), default=0)

    # (openmetrics series, value or rate, is a counter, reach in ms, step in s)
    series: list[tuple[str, float, bool, int, float]] = []
    recorded_count = 0
    for n in nodes:
        target = (("job", "outrider"), ("instance", n.target))
        for (name, labels), (v2, counter) in [*second[n.index].items(), (("up", ()), (1.0, False))]:
            full = dict(labels + target)
            if reach_ms := reach(name, full):
                v1 = first[n.index].get((name, labels), (v2, counter))[0]
                value = max(0.0, (v2 - v1) / (t2 - t1)) if counter else v2
                series.append((_series(name, labels + target), value, counter, reach_ms, interval_s))
    unfilled = []
    for name, found in recorded_series.items():
        step = recorded[name][1] or interval_s
        for labels, value in found:
            if (reach_ms := reach(name, dict(labels))) and math.isfinite(value):
                series.append((_series(name, labels), value, False, reach_ms, step))
                recorded_count += 1
    for name in recorded:
        if any(sel.name == name for sel in wanted) and not recorded_series.get(name):
            unfilled.append(name)
    t0 = math.floor(time.time())  # Prometheus starts right after: the history ends before its first scrape
    om = work / "backfill.om"
    lines = 0
    with open(om, "w") as fh:  # series after series, each in time order (what promtool needs)
        for text, value, counter, reach_ms, step in series:
            horizon_s = reach_ms / 1000 + step
            for k in range(int(horizon_s // step), 0, -1):
                v = value * (horizon_s - k * step) if counter else value
                fh.write(f"{text} {v!r} {t0 - k * step:.3f}\n")
                lines += 1
        fh.write("# EOF\n")
    started = time.monotonic()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(om), str(data_dir)],
                   check=True, capture_output=True, text=True)
    om.unlink()
    return {"series": len(series), "samples": lines, "hours": max((r for *_, r, _ in series), default=0) / 3.6e6,
            "promtool_s": time.monotonic() - started, "not_backfilled_recorded": sorted(unfilled),
            "recorded_series": recorded_count}


def _series(name: str, labels: Labels) -> str:
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# --- Prometheus -----------------------------------------------------------------------------------------------


class Prometheus:
    def __init__(self, binary: str, work: Path, targets: list[str], interval_s: int, procs: Processes) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.work, self.targets, self.interval_s = work, targets, interval_s
        work.mkdir(parents=True, exist_ok=True)
        self.config = work / "prometheus.yml"
        self.write_config(rules=True)
        self.proc = procs.start([binary, f"--config.file={self.config}", f"--storage.tsdb.path={work / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                                 "--enable-feature=extra-scrape-metrics", "--log.level=warn"],
                                {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")},
                                work / "prometheus.log")
        wait_until(lambda: self._alive() and http_get(self.url + "/-/ready", timeout_s=2)[0] == 200, 120,
                   "Prometheus /-/ready")

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError("prometheus exited: " + (self.work / "prometheus.log").read_text()[-2000:])
        return True

    def write_config(self, rules: bool) -> None:
        """Evaluation at the scrape interval, as the agent's own rule_interval_s would be; the catalog's recording
        group keeps its own 30 s."""
        config = {
            "global": {"scrape_interval": f"{self.interval_s}s", "evaluation_interval": f"{self.interval_s}s",
                       "scrape_timeout": f"{min(10, self.interval_s)}s"},
            "rule_files": [str(RULES)] if rules else [],
            "scrape_configs": [
                {"job_name": "outrider", "static_configs": [{"targets": self.targets}]},
                {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]},
            ],
        }
        self.config.write_text(json.dumps(config))

    def reload(self, rules: bool) -> None:
        self.write_config(rules)
        req = urllib.request.Request(self.url + "/-/reload", method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200

    def query(self, promql: str) -> list[dict[str, Any]]:
        status, body, _ = http_get(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}),
                                   timeout_s=30)
        data = json.loads(body)
        if status != 200 or data.get("status") != "success":
            raise RuntimeError(f"{promql}: {data}")
        return list(data["data"]["result"])

    def scalar(self, promql: str) -> float:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else float("nan")

    def by(self, promql: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(promql)}

    def query_stats(self, promql: str) -> dict[str, Any]:
        """Prometheus's own account of one evaluation: samples read (totalQueryableSamples) and time taken."""
        status, body, _ = http_get(self.url + "/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql, "stats": "all"}), timeout_s=60)
        data = json.loads(body)
        if status != 200 or data.get("status") != "success":
            raise RuntimeError(f"{promql}: {data}")
        return dict(data["data"]["stats"])

    def rules(self) -> list[dict[str, Any]]:
        status, body, _ = http_get(self.url + "/api/v1/rules", timeout_s=30)
        return list(json.loads(body)["data"]["groups"]) if status == 200 else []


# --- the run --------------------------------------------------------------------------------------------------


class Watch:
    """Samples what the run needs between phases: Prometheus's RSS, the machine's load and free memory, and every
    rule group's and rule's evaluation time once per evaluation (deduplicated by its timestamp)."""

    def __init__(self, prom: Prometheus, min_available_kib: int) -> None:
        self.prom, self.min_available_kib = prom, min_available_kib
        self.group_s: dict[str, dict[str, float]] = defaultdict(dict)  # group -> {lastEvaluation: seconds}
        self.rule_s: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        self.group_interval_s: dict[str, float] = {}
        self.rss_kib: list[int] = []
        self.load: list[float] = []
        self.available_kib: list[int] = []

    def sample(self, rules: bool) -> None:
        self.rss_kib.append(status_kib(self.prom.proc.pid, "VmRSS"))
        self.load.append(loadavg())
        available = meminfo_kib("MemAvailable")
        self.available_kib.append(available)
        if available < self.min_available_kib:
            raise RuntimeError(f"the machine is down to {available // 1024} MiB available: stopping the run")
        if not rules:
            return
        for g in self.prom.rules():
            self.group_interval_s[g["name"]] = float(g["interval"])
            if g.get("lastEvaluation", "").startswith("0001"):
                continue
            self.group_s[g["name"]][g["lastEvaluation"]] = float(g["evaluationTime"])
            for r in g["rules"]:
                if not r.get("lastEvaluation", "").startswith("0001"):
                    self.rule_s[(g["name"], r["name"])][r["lastEvaluation"]] = float(r["evaluationTime"])

    def run_for(self, seconds: float, rules: bool) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.sample(rules)
            time.sleep(min(self.prom.interval_s / 3, max(0.0, end - time.monotonic())))


HOOK_ROLES = (  # metric name prefix -> which hooked processes publish it (the catalog says only "hook")
    ("outrider_train_", "training"), ("outrider_samples_", "training"), ("outrider_tokens_", "training"),
    ("outrider_torch_", "training"), ("outrider_request", "inference"), ("outrider_inference_", "inference"),
    ("outrider_latency_", "inference"), ("outrider_thread", "every process"),
)


def _family(sample_name: str) -> str:
    """The catalog's family of a sample name (histogram and counter suffixes taken off where the catalog lacks the
    name as exposed)."""
    from outrider.metrics.catalog import CATALOG

    if sample_name in CATALOG:
        return sample_name
    for suffix in ("_bucket", "_count", "_sum", "_created", "_total", "_info"):
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in CATALOG:
            return sample_name[: -len(suffix)]
    return sample_name


def _source(family: str) -> str:
    """What publishes a family: the collector the metrics catalog names, the hook's by the processes' role."""
    from outrider.metrics.catalog import CATALOG

    d = CATALOG.get(family)
    if d is None:
        return "not in the catalog"
    if d.collector == "hook":
        return "hook: " + next((role for prefix, role in HOOK_ROLES if family.startswith(prefix)), "processes")
    return {"self": "agent itself", "alerts": "agent's alert state"}.get(d.collector, d.collector + " collector")


def samples_by_source(body: str) -> dict[str, dict[str, int]]:
    """{source: {"samples": n, "buckets": histogram bucket samples among them}} of one node's exposition."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"samples": 0, "buckets": 0})
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        source = _source(_family(name))
        out[source]["samples"] += 1
        out[source]["buckets"] += name.endswith("_bucket")
    return dict(out)


def samples_by_family(body: str, top: int = 12) -> list[tuple[str, int]]:
    """The families with the most samples in one node's exposition, most first: where a node's series come from."""
    counts: dict[str, int] = defaultdict(int)
    for line in body.splitlines():
        if line and not line.startswith("#"):
            counts[_family(line.split("{", 1)[0].split(" ", 1)[0])] += 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:top]


def rule_samples(prom: Prometheus) -> dict[str, dict[str, float]]:
    """{rule: samples it reads per evaluation, and the time of one evaluation as a query}: why a rule costs what it
    costs (a range window reads every sample of every series it selects)."""
    import yaml

    out = {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            stats = prom.query_stats(rule["expr"])
            out[rule.get("alert") or rule["record"]] = {
                "group": group["name"], "samples": float(stats["samples"]["totalQueryableSamples"]),
                "query_s": float(stats["timings"]["evalTotalTime"])}
    return out


def drift_scenarios(nodes: list[Node], gpus: int, rng: random.Random) -> None:
    for n in nodes:
        write_scenario(n, gpus, rng)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--gpus", type=int, default=8, help="fake GPUs per node")
    ap.add_argument("--ranks", type=int, default=8, help="training ranks per node (one per GPU)")
    ap.add_argument("--interval", type=int, default=15, help="scrape, sweep and evaluation interval, seconds")
    ap.add_argument("--stagger-s", type=float, default=1.5, help="seconds between two nodes' starts")
    ap.add_argument("--warmup-min", type=float, default=5.0, help="after the last node is up, before measuring")
    ap.add_argument("--phase-min", type=float, default=3.0, help="length of each rules-on and rules-off phase")
    ap.add_argument("--cycles", type=int, default=2, help="(rules off, rules on) phase pairs")
    ap.add_argument("--step-s", type=float, default=0.5, help="training step time of the workload")
    ap.add_argument("--request-s", type=float, default=0.1, help="seconds between inference requests")
    ap.add_argument("--flush-interval", type=float, default=5.0, help="the hook's shard updates, seconds")
    ap.add_argument("--no-backfill", action="store_true", help="evaluate the rules over the live data only")
    ap.add_argument("--reserve-gib", type=float, default=3.0, help="start no node below this much available memory")
    ap.add_argument("--quick", action="store_true",
                    help="check that the benchmark runs (about 6 minutes): 8 nodes, 1 min warm-up, one pair of 1 min "
                         "phases; docs/cost.md's figures come from the full run")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, Prometheus's data)")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.warmup_min, args.phase_min, args.cycles = min(args.nodes, 8), 1.0, 1.0, 1
    prometheus = shutil.which("prometheus")
    if not prometheus or not shutil.which("promtool"):
        raise SystemExit("install Debian's prometheus (apt-get install prometheus): it brings promtool too")

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    work = Path(tempfile.mkdtemp(prefix="outrider-fleet-"))
    procs = Processes()
    nodes: list[Node] = []
    try:
        figures = run(args, prometheus, work, procs, nodes)
    except KeyboardInterrupt:
        print("interrupted: stopping every process started", file=sys.stderr)
        return 130
    finally:
        for n in nodes:
            (n.dir / "hold").touch()
        procs.stop_all()
        if args.keep:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    report(figures, args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 1 if figures["self_check"]["mismatched"] else 0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, prometheus: str, work: Path, procs: Processes, nodes: list[Node]) -> dict[str, Any]:
    rng = random.Random(20)
    lib = build(work / "nvml")["full"]
    available0 = meminfo_kib("MemAvailable")
    log(f"starting {args.nodes} nodes, {args.stagger_s} s apart ({available0 // 1024} MiB available)")
    stopped_early = None
    for k in range(args.nodes):
        if meminfo_kib("MemAvailable") < args.reserve_gib * 2**20:
            stopped_early = f"stopped at {k} nodes: under {args.reserve_gib} GiB available"
            log(stopped_early)
            break
        nodes.append(start_node(k, args, work, lib, procs, rng))
        time.sleep(args.stagger_s)
    for n in nodes:
        wait_until(lambda n=n: agent_ready(n), 120, f"node {n.index}'s agent")
    # every rank has published and every GPU has been swept: the series set is complete
    time.sleep(args.interval + args.flush_interval + 1)
    log("all agents ready")

    prom_dir = work / "prometheus"
    (prom_dir / "data").mkdir(parents=True)
    warmup_s = args.warmup_min * 60
    filled = None
    if not args.no_backfill:
        _, recorded = rule_file()
        log("probing what the recording rules record")
        recorded_series = probe_recorded(prometheus, work, nodes, args.interval, procs, recorded)
        log(f"{sum(len(v) for v in recorded_series.values())} recorded series; backfilling the rules' windows")
        filled = backfill(nodes, args.interval, prom_dir / "data", work, warmup_s, recorded_series, recorded)
        log(f"backfilled {filled['series']} series, {filled['samples']} samples over {filled['hours']:.1f} h "
            f"in {filled['promtool_s']:.0f} s")
    prom = Prometheus(prometheus, prom_dir, [n.target for n in nodes], args.interval, procs)
    watch = Watch(prom, min_available_kib=512 * 1024)
    base_rss_kib = status_kib(prom.proc.pid, "VmRSS")
    log(f"Prometheus up on {prom.url}; warming up {args.warmup_min} min")

    # the GPU readings drift every interval, on a thread of their own pace: one write per node per interval
    import threading

    stop_drift = threading.Event()

    def drift() -> None:
        while not stop_drift.wait(args.interval):
            drift_scenarios(nodes, args.gpus, rng)

    threading.Thread(target=drift, daemon=True).start()
    try:
        watch.run_for(warmup_s, rules=False)  # rule times are recorded in the measured phases only
        watch.load.clear()
        phases: list[dict[str, Any]] = []
        fleet_pids = [pid for n in nodes for pid in n.pids()]
        fleet_cpu0, busy0, wall0 = sum(cpu_seconds(p) for p in fleet_pids), machine_busy_seconds(), time.monotonic()
        for _ in range(args.cycles):
            for rules in (False, True):  # ends with the rules loaded: the figures below see them fresh
                prom.reload(rules)
                log(f"phase {len(phases) + 1}: rules {'loaded' if rules else 'unloaded'}, {args.phase_min} min")
                appended0 = prom.scalar("prometheus_tsdb_head_samples_appended_total")
                cpu0, t0 = cpu_seconds(prom.proc.pid), time.monotonic()
                watch.run_for(args.phase_min * 60, rules)
                cpu1, t1 = cpu_seconds(prom.proc.pid), time.monotonic()
                appended1 = prom.scalar("prometheus_tsdb_head_samples_appended_total")
                phases.append({"rules": rules, "seconds": t1 - t0, "cpu_s": cpu1 - cpu0,
                               "samples_appended": appended1 - appended0,
                               "rss_mib": status_kib(prom.proc.pid, "VmRSS") / 1024})
        fleet_cpu1, busy1, wall1 = sum(cpu_seconds(p) for p in fleet_pids), machine_busy_seconds(), time.monotonic()
        rule_reads = rule_samples(prom)

        # the series and the bytes, at the end, rules loaded
        scraped = prom.by('scrape_samples_scraped{job="outrider"}', "instance")
        body = prom.by('scrape_body_size_bytes{job="outrider"}', "instance")
        duration = prom.by('scrape_duration_seconds{job="outrider"}', "instance")
        in_head = prom.by('count by (instance) ({job="outrider"})', "instance")
        head_series = prom.scalar("prometheus_tsdb_head_series")
        recorded = prom.scalar('count({__name__=~"outrider:.+"})')  # the rules-on phase has just run
        alerts = prom.scalar("count(ALERTS)")
        self_series = prom.scalar('count({job="prometheus"})')
        heap = prom.scalar('go_memstats_heap_inuse_bytes{job="prometheus"}')
        missed = {k.split(";")[-1]: v for k, v in
                  prom.by("prometheus_rule_group_iterations_missed_total", "rule_group").items()}
        quantiles = prom.by('prometheus_rule_evaluation_duration_seconds{job="prometheus"}', "quantile")
        ingest_rate = prom.scalar(f"rate(prometheus_tsdb_head_samples_appended_total[{int(args.phase_min * 60)}s])")
        fetched = [fetch(n) for n in nodes]
        firing = sorted({r["metric"]["alertname"] for r in prom.query('ALERTS{alertstate="firing"}')})
    finally:
        stop_drift.set()

    end_rss_kib = status_kib(prom.proc.pid, "VmRSS")
    pss = {n.index: sum(pss_kib(p) for p in n.pids()) for n in nodes}
    agent_rss = [status_kib(n.agent.pid, "VmRSS") for n in nodes if n.agent is not None]
    on = [p for p in phases if p["rules"]]
    off = [p for p in phases if not p["rules"]]
    cpu_on = sum(p["cpu_s"] for p in on) / sum(p["seconds"] for p in on)
    cpu_off = sum(p["cpu_s"] for p in off) / sum(p["seconds"] for p in off)
    samples_per_s_off = sum(p["samples_appended"] for p in off) / sum(p["seconds"] for p in off)
    groups = {}
    for g, evals in watch.group_s.items():
        values = sorted(evals.values())
        groups[g] = {"evaluations": len(values), "median_s": statistics.median(values),
                     "p90_s": values[math.ceil(0.9 * len(values)) - 1], "max_s": values[-1],
                     "interval_s": watch.group_interval_s.get(g, args.interval),
                     "missed_iterations": missed.get(g, 0.0)}
    rule_costs = sorted(((statistics.median(v.values()), g, r) for (g, r), v in watch.rule_s.items() if v),
                        reverse=True)
    n_nodes = len(nodes)
    per_node_scraped = list(scraped.values())
    per_node_head = list(in_head.values())
    busy = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1])
    figures: dict[str, Any] = {
        "parameters": {
            "nodes": n_nodes, "gpus_per_node": args.gpus, "ranks_per_node": args.ranks,
            "inference_servers_per_node": 1, "interval_s": args.interval, "warmup_min": args.warmup_min,
            "phase_min": args.phase_min, "cycles": args.cycles, "step_s": args.step_s,
            "request_s": args.request_s, "hook_flush_interval_s": args.flush_interval,
            "stagger_s": args.stagger_s, "backfill": filled, "stopped_early": stopped_early,
            "rules_file_sha": _git_blob(RULES), "prometheus": _version(prometheus),
        },
        "machine": {
            "cpus": os.cpu_count(), "load_avg_mean": statistics.mean(watch.load), "load_avg_max": max(watch.load),
            "busy_fraction_of_all_cpus": busy,
            "fleet_cpu_cores": (fleet_cpu1 - fleet_cpu0) / (wall1 - wall0),
            "fleet_pss_mib": sum(pss.values()) / 1024, "pss_mib_per_node": statistics.mean(pss.values()) / 1024,
            "agent_rss_mib_median": statistics.median(agent_rss) / 1024,
            "mem_available_mib_start": available0 / 1024, "mem_available_mib_min": min(watch.available_kib) / 1024,
        },
        "per_node": {
            "samples_scraped_median": statistics.median(per_node_scraped),
            "samples_scraped_min": min(per_node_scraped), "samples_scraped_max": max(per_node_scraped),
            "series_in_head_median": statistics.median(per_node_head),
            "body_bytes_uncompressed_median": statistics.median(body.values()) if body else None,
            "fetched_bytes_gzip_median": statistics.median(f[0] for f in fetched),
            "fetched_bytes_uncompressed_median": statistics.median(f[1] for f in fetched),
            "scrape_duration_s_median": statistics.median(duration.values()),
            "scrape_duration_s_max": max(duration.values()),
            "samples_by_source": samples_by_source(fetched[0][2]),
            "samples_by_family": samples_by_family(fetched[0][2]),
            "recorded_series": recorded / n_nodes,
        },
        "prometheus": {
            "head_series": head_series, "self_series": self_series, "recorded_series": recorded,
            "alerts_series": 0 if math.isnan(alerts) else alerts, "firing": firing,
            "ingest_samples_per_s": ingest_rate, "rss_mib_start": base_rss_kib / 1024,
            "rss_mib_end": end_rss_kib / 1024, "rss_mib_max": max(watch.rss_kib) / 1024, "heap_inuse_mib": heap / MIB,
            "bytes_per_series_rss": (end_rss_kib - base_rss_kib) * 1024 / head_series,
            "bytes_per_series_heap": heap / head_series,
            "cpu_cores_rules_on": cpu_on, "cpu_cores_rules_off": cpu_off,
            "cpu_cores_rules": cpu_on - cpu_off,
            "cpu_us_per_sample_ingested": 1e6 * cpu_off / samples_per_s_off,
            "rule_eval_quantiles_s": quantiles, "phases": phases,
        },
        "groups": groups,
        "top_rules": [{"group": g, "rule": r, "median_s": s,
                       "samples_read_per_node": rule_reads.get(r, {}).get("samples", float("nan")) / len(nodes)}
                      for s, g, r in rule_costs[:10]],
        "rule_samples_read": rule_reads,
        "self_check": self_check(nodes, fetched, scraped),
    }
    # the groups' wall time against the CPU the rules took (the difference between the phases): above 1 where
    # the machine's load stretched the evaluations
    wall_per_s = sum(v["median_s"] / v["interval_s"] for v in groups.values())
    figures["prometheus"]["rule_wall_over_cpu"] = wall_per_s / max(cpu_on - cpu_off, 1e-9)
    figures["sizing"] = sizing(figures)
    return figures


def self_check(nodes: list[Node], fetched: list[tuple[int, int, str]], scraped: dict[str, float]) -> dict[str, Any]:
    """Prometheus ingested what the agents expose: each node's last scrape_samples_scraped against the samples in
    a fetch of its /metrics moments later (a hooked process may add or retire a series in between: a few apart is
    churn, a node missing or far apart is a broken measurement)."""
    mismatched = {}
    for n, (_, _, text) in zip(nodes, fetched):
        exposed = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        got = scraped.get(n.target)
        if got is None or abs(got - exposed) > max(5, 0.01 * exposed):
            mismatched[n.target] = {"scraped": got, "exposed": exposed}
    return {"nodes": len(nodes), "mismatched": mismatched}


def _git_blob(path: Path) -> str:
    out = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, cwd=REPO)
    log_line = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", str(path)], capture_output=True,
                              text=True, cwd=REPO).stdout.strip()
    return f"{out.stdout.strip()[:12]} (last commit {log_line})"


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).splitlines()[0]


# --- extrapolation --------------------------------------------------------------------------------------------


def sizing(f: dict[str, Any]) -> dict[str, Any]:
    """Everything that Prometheus holds, ingests and evaluates grows with the number of nodes: each node brings
    its own series, and every rule's selectors and aggregations touch each node's series once per evaluation
    (no rule joins a node to every other). So each figure is the measured one per node times the fleet.

    A group's evaluation time is projected twice: from its median wall time here, and from its share of the CPU
    the rules took (the groups' wall times scaled so that they add up to the rules' CPU): on a dedicated server a
    group runs on one core for about its CPU time, where on this shared machine it also waits for a core."""
    n = f["parameters"]["nodes"]
    interval = f["parameters"]["interval_s"]
    p = f["prometheus"]
    series_per_node = (p["head_series"] - p["self_series"]) / n
    per_sample_us = p["cpu_us_per_sample_ingested"]
    groups = f["groups"]
    wall = {g: v["median_s"] / n for g, v in groups.items()}  # per node
    cpu = {g: s / p["rule_wall_over_cpu"] for g, s in wall.items()}

    def slowest(per_node: dict[str, float], size: int) -> tuple[str, float, float]:
        g = max(per_node, key=lambda g: per_node[g] / groups[g]["interval_s"])
        return g, per_node[g] * size, per_node[g] * size / groups[g]["interval_s"]

    rows = {}
    for size in SIZES:
        series = series_per_node * size
        ingest = series / interval
        rows[size] = {
            "series": series, "ingest_samples_per_s": ingest,
            "scrape_traffic_bytes_per_s": size * f["per_node"]["fetched_bytes_gzip_median"] / interval,
            "head_memory_gib": series * p["bytes_per_series_rss"] / 2**30,
            "ingest_cpu_cores": ingest * per_sample_us / 1e6,
            "rule_cpu_cores": p["cpu_cores_rules"] * size / n,
            "rule_group_wall_s": {g: s * size for g, s in wall.items()},
            "rule_group_cpu_s": {g: s * size for g, s in cpu.items()},
            "slowest_wall": slowest(wall, size), "slowest_cpu": slowest(cpu, size),
        }

    def nodes_at(per_node: dict[str, float], share: float) -> float:
        return min(share * groups[g]["interval_s"] / s for g, s in per_node.items())

    # where one Prometheus stops being enough, by each constraint
    return {"series_per_node": series_per_node, "rows": rows,
            "limit_nodes": {
                "head_memory_32gib": HEAD_MEMORY_BUDGET_BYTES / (series_per_node * p["bytes_per_series_rss"]),
                "rule_group_half_interval_cpu": nodes_at(cpu, RULE_TIME_BUDGET),
                "rule_group_whole_interval_cpu": nodes_at(cpu, 1.0),
                "rule_group_half_interval_wall": nodes_at(wall, RULE_TIME_BUDGET),
                "rule_group_whole_interval_wall": nodes_at(wall, 1.0)}}


# --- the report -----------------------------------------------------------------------------------------------


def report(f: dict[str, Any], args: argparse.Namespace) -> None:
    par, m, node, p, s = f["parameters"], f["machine"], f["per_node"], f["prometheus"], f["sizing"]
    print(f"\n{par['nodes']} simulated nodes x {par['gpus_per_node']} fake GPUs, {par['ranks_per_node']} training "
          f"ranks + 1 inference server each; scrape = sweep = evaluation interval {par['interval_s']} s; "
          f"{par['warmup_min']} min warm-up, then {par['cycles']} x (rules off, rules on) phases of "
          f"{par['phase_min']} min; {par['prometheus']}; rule file {par['rules_file_sha']}")
    if par["backfill"]:
        b = par["backfill"]
        print(f"backfilled for the rules' windows: {b['series']} series ({b['recorded_series']} of them recorded), "
              f"{b['samples']:,} samples, up to {b['hours']:.1f} h back (recorded series read far back that no "
              f"probe evaluation produced, not backfilled: {', '.join(b['not_backfilled_recorded']) or 'none'})")
    else:
        print("no backfill: rules with windows longer than the run evaluated over the live data only")
    if par["stopped_early"]:
        print(par["stopped_early"])
    print(f"\nmachine: {m['cpus']} CPUs, load average {m['load_avg_mean']:.1f} (max {m['load_avg_max']:.1f}), "
          f"{100 * m['busy_fraction_of_all_cpus']:.0f}% of all CPUs busy (everyone's work); the fleet (agents and "
          f"workloads) used {m['fleet_cpu_cores']:.2f} cores and {m['fleet_pss_mib']:.0f} MiB PSS "
          f"({m['pss_mib_per_node']:.1f} MiB per node; agent RSS {m['agent_rss_mib_median']:.1f} MiB); memory "
          f"available {m['mem_available_mib_start']:.0f} MiB at the start, {m['mem_available_mib_min']:.0f} MiB "
          f"at the lowest")
    per_node_cores = m["fleet_cpu_cores"] / par["nodes"]
    sustain_mem = (m["mem_available_mib_start"] - 3 * 1024) / m["pss_mib_per_node"]
    sustain_cpu = 0.5 * (m["cpus"] or 1) / per_node_cores
    print(f"this machine could sustain about {sustain_mem:.0f} such nodes by memory (keeping 3 GiB free) and "
          f"{sustain_cpu:.0f} by CPU (half its cores, {1000 * per_node_cores:.1f} millicores per node)")

    rows = [
        ("samples per scrape per node (scrape_samples_scraped)",
         f"{node['samples_scraped_median']:.0f} (min {node['samples_scraped_min']:.0f}, max "
         f"{node['samples_scraped_max']:.0f})"),
        ("series per node in the head (+ up and scrape_*)", f"{node['series_in_head_median']:.0f}"),
        ("recorded series per node (outrider:*)", f"{node['recorded_series']:.1f}"),
        ("bytes per scrape, gzip as Prometheus fetches it", f"{node['fetched_bytes_gzip_median'] / 1024:.1f} KiB"),
        ("bytes per scrape, uncompressed (OpenMetrics)",
         f"{node['fetched_bytes_uncompressed_median'] / 1024:.1f} KiB (scrape_body_size_bytes "
         f"{(node['body_bytes_uncompressed_median'] or 0) / 1024:.1f} KiB)"),
        ("scrape duration per node, median / max",
         f"{1000 * node['scrape_duration_s_median']:.1f} / {1000 * node['scrape_duration_s_max']:.1f} ms"),
        ("head series, all (self-scrape: " + f"{p['self_series']:.0f})", f"{p['head_series']:,.0f}"),
        ("ingest", f"{p['ingest_samples_per_s']:,.0f} samples/s"),
        ("Prometheus RSS: before the first scrape / end / max",
         f"{p['rss_mib_start']:.0f} / {p['rss_mib_end']:.0f} / {p['rss_mib_max']:.0f} MiB (Go heap in use "
         f"{p['heap_inuse_mib']:.0f} MiB)"),
        ("Prometheus memory per head series (RSS growth / series)",
         f"{p['bytes_per_series_rss']:,.0f} bytes (heap in use / series: {p['bytes_per_series_heap']:,.0f})"),
        ("Prometheus CPU, rules loaded / unloaded",
         f"{1000 * p['cpu_cores_rules_on']:.0f} / {1000 * p['cpu_cores_rules_off']:.0f} millicores "
         f"(rules: {1000 * p['cpu_cores_rules']:.0f})"),
        ("Prometheus CPU per ingested sample (rules unloaded)", f"{p['cpu_us_per_sample_ingested']:.1f} µs"),
        ("rule evaluation, all rules: p50 / p99 (prometheus_rule_evaluation_duration_seconds)",
         " / ".join(f"{1000 * p['rule_eval_quantiles_s'].get(q, float('nan')):.2f}" for q in ("0.5", "0.99"))
         + " ms"),
    ]
    width = max(len(r[0]) for r in rows)
    print("\nmeasured")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print("  one node's samples by source: " + "; ".join(
        f"{src} {v['samples']} ({v['buckets']} histogram buckets)"
        for src, v in sorted(node["samples_by_source"].items(), key=lambda kv: -kv[1]["samples"])))
    print("  one node's largest families (samples): " + "; ".join(
        f"{name} {count}" for name, count in node["samples_by_family"]))
    print("\nrule groups (prometheus_rule_group_last_duration_seconds, every evaluation of the rules-on phases)")
    print(f"  {'group':<24}{'interval':>9}{'evals':>7}{'median':>10}{'p90':>10}{'max':>10}{'missed':>8}")
    for g, v in sorted(f["groups"].items()):
        print(f"  {g:<24}{v['interval_s']:>8.0f}s{v['evaluations']:>7}{1000 * v['median_s']:>8.1f}ms"
              f"{1000 * v['p90_s']:>8.1f}ms{1000 * v['max_s']:>8.1f}ms{v['missed_iterations']:>8.0f}")
    print(f"  the groups' median wall time is {p['rule_wall_over_cpu']:.2f}x the CPU the rules took (rules on - off)")
    total_reads = sum(r["samples"] for r in f["rule_samples_read"].values())
    print(f"  samples read by one evaluation of every rule: {total_reads / par['nodes']:,.0f} per node")
    print(f"  costliest rules: {'rule':<46}{'group':<22}{'median':>9}{'samples read per node':>23}")
    for r in f["top_rules"]:
        print(f"  {'':<17}{r['rule']:<46}{r['group']:<22}{1000 * r['median_s']:>7.2f}ms"
              f"{r['samples_read_per_node']:>23,.0f}")
    if p["firing"]:
        print(f"  firing at the end: {', '.join(p['firing'])}")
    check = f["self_check"]
    print("  self-check, samples each node exposes = samples Prometheus scraped from it: "
          + (f"{check['nodes']} nodes agree" if not check["mismatched"] else f"MISMATCH {check['mismatched']}"))

    print(f"\nsizing: one Prometheus, {s['series_per_node']:.0f} series per node (8 GPUs, 8 ranks, 1 inference "
          f"server), scraped and evaluated every {par['interval_s']} s, each figure the measured one x nodes / "
          f"{par['nodes']}")
    print(f"  {'GPU nodes':>10}{'series':>13}{'samples/s':>12}{'scrapes, gzip':>14}{'head memory':>13}"
          f"{'ingest CPU':>12}{'rule CPU':>12}  slowest rule group per evaluation: by its CPU share (wall here)")
    for size, r in s["rows"].items():
        g, secs, share = r["slowest_cpu"]
        _, wall_s, wall_share = r["slowest_wall"]
        print(f"  {size:>10,}{r['series']:>13,.0f}{r['ingest_samples_per_s']:>12,.0f}"
              f"{r['scrape_traffic_bytes_per_s'] / 2**20:>9.2f} MiB/s"
              f"{r['head_memory_gib']:>10.1f} GiB{r['ingest_cpu_cores']:>7.2f} cores{r['rule_cpu_cores']:>6.2f} cores"
              f"  {g} {secs:.2f} s = {100 * share:.0f}% of its interval ({wall_s:.2f} s, {100 * wall_share:.0f}%)")
    lim = s["limit_nodes"]
    print(f"  one Prometheus reaches: 32 GiB of head at {lim['head_memory_32gib']:,.0f} nodes; a rule group "
          f"taking half its interval at {lim['rule_group_half_interval_cpu']:,.0f} nodes, all of it (iterations "
          f"skipped) at {lim['rule_group_whole_interval_cpu']:,.0f} nodes (by wall time here: "
          f"{lim['rule_group_half_interval_wall']:,.0f} and {lim['rule_group_whole_interval_wall']:,.0f})")


if __name__ == "__main__":
    raise SystemExit(main())

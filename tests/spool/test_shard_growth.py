"""A shard never goes dark: a real process whose series outgrow the shard's first file keeps publishing every step
and every series (the shard grows), up to the documented caps; past the format's limit what is left out is counted
and the heartbeat and steps keep coming (no false stall).

Once a service of 258 series (150 route templates x 2 status codes, capped at 100 per metric, and 30 latency names)
outgrew a fixed 60 KiB directory, and nothing of that process was published again: the agent showed 39 of 790
steps and paged a stall."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from outrider.collectors.base import CollectorContext
from outrider.collectors.hook import HookCollector
from outrider.ground.config import Config
from outrider.hook.publisher import ShardPublisher
from outrider.hook.series import Dropped
from outrider.metrics.exposition import render
from outrider.shared import spool
from tests.helpers import release, samples, value, wait_until

# Steps, with series registered between them (the shard grows while the agent reads it), then the totals the
# process says it has, then it waits for `hold`.
SERVICE = textwrap.dedent("""
    import json, pathlib, sys, time
    import outrider
    routes, statuses, latencies, extra, steps, hold, report = sys.argv[1:]
    routes, statuses, latencies, extra, steps = map(int, (routes, statuses, latencies, extra, steps))
    outrider.instrument()
    todo = [("request", f"/api/v1/tenants/{{tenant_id}}/projects/{{project_id}}/resource-{r:03d}/items/{{item_id}}",
             200 + 300 * s) for r in range(routes) for s in range(statuses)]
    todo += [("latency", f"backend-call-{i:02d}-" + "x" * 60, 0) for i in range(latencies)]
    todo += [("extra", f"{m}", i) for m in range(extra // 100 + 1) for i in range(min(100, extra - 100 * m))]
    per_step = len(todo) // steps + 1
    for n in range(steps):
        for kind, name, code in todo[n * per_step:(n + 1) * per_step]:
            if kind == "request":
                outrider.record_request(0.01, route=name, status=code, method="GET")
            elif kind == "latency":
                outrider.record_latency(0.002, name)
            else:
                labels = {"shard": "s" * 100 + str(code), "zone": "z" * 120, "model": "m" * 127}
                if code % 2:
                    outrider.histogram(f"workload_extra_{name}_seconds", labels).observe(0.1)
                else:
                    outrider.counter(f"workload_extra_{name}", labels).inc()
        with outrider.step():
            time.sleep(0.002)
    time.sleep(0.3)
    from outrider.hook import api
    pathlib.Path(report).write_text(json.dumps({
        "steps": steps, "registered": len(api.S.hook.registry._series),
        "extra": sum(1 for name, _ in api.S.hook.registry._series if name.startswith("workload_extra_")),
        "dropped": dict(api.S.hook.drop.counts)}))
    while not pathlib.Path(hold).exists():
        time.sleep(0.05)
""")


def _env(spool_dir: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTRIDER_")}
    return {**base, "OUTRIDER_SPOOL_DIR": str(spool_dir), "OUTRIDER_FLUSH_INTERVAL_S": "0.2",
            "OUTRIDER_STANDALONE": "false"}


def _exposed(c: HookCollector) -> dict:  # type: ignore[type-arg]
    return samples(render(c.collect()).decode())


def _series_in(parsed: dict, prefix: str) -> int:  # type: ignore[type-arg]
    """Distinct series of metrics whose name starts with prefix (a histogram counted once, by its _count)."""
    return sum(1 for (name, _labels) in parsed if name.startswith(prefix) and
               (name.endswith("_count") or not any(name.endswith(s) for s in ("_bucket", "_sum"))))


@pytest.mark.parametrize("shape", ["service_258", "max_series_per_process"])
def test_a_process_that_outgrows_its_shard_publishes_every_step_and_every_series(tmp_path: Path,
                                                                                   shape: str) -> None:
    sp, hold, report = tmp_path / "spool", tmp_path / "hold", tmp_path / "report.json"
    # service_258: the incident's shape. max_series_per_process: requests and latencies as above, then custom
    # series of three long labels (counters and histograms) up to the registry's cap of 2,000 and a few past it.
    extra = 0 if shape == "service_258" else 1900
    steps = 400
    p = subprocess.Popen([sys.executable, "-c", SERVICE, "150", "2", "30", str(extra), str(steps), str(hold),
                          str(report)], env=_env(sp), stderr=subprocess.PIPE)
    c = HookCollector(CollectorContext(Config(spool_dir=str(sp), flush_interval_s=0.2), hold_spool_lock=False))
    try:
        seen_steps: list[float] = []
        generations: set[int] = set()
        wrong: list[str] = []

        def done() -> bool:
            parsed = _exposed(c)
            steps_now = value(parsed, "outrider_train_steps_total")
            if steps_now is not None:
                seen_steps.append(steps_now)
            for proc in c.processes:
                generations.add(proc.header.generation)
                if proc.state != "running":
                    wrong.append(f"a false {proc.state} while the shard grew")
            if value(parsed, "outrider_hook_stalled", rank="", training_job=""):
                wrong.append("a stall page from a growing shard")
            return report.exists() and steps_now == steps
        wait_until(done, timeout_s=120, interval_s=0.1, what="every step published")
        assert wrong == []
        assert seen_steps == sorted(seen_steps), "steps never went backwards while the shard was regrown"
        assert max(generations) >= 1, "the shard outgrew its first file (else this test shows nothing)"
        said = json.loads(report.read_text())
        parsed = _exposed(c)
        assert c.shard_errors == {}, "no shard was ever unreadable while it grew"
        assert value(parsed, "outrider_train_steps_total") == steps
        assert _series_in(parsed, "outrider_requests_total") == 100, "capped at 100 per metric"
        assert _series_in(parsed, "outrider_request_duration_seconds") == 100
        assert _series_in(parsed, "outrider_latency_seconds") == 30
        assert value(parsed, "outrider_hook_dropped_total", reason="series_limit_per_metric") == \
            said["dropped"]["series_limit_per_metric"] > 0, "past the per-metric cap: counted, by reason"
        assert "shard_full" not in said["dropped"], "within the caps nothing is left out of the shard"
        if shape == "max_series_per_process":
            assert said["registered"] >= 2000
            assert said["extra"] > 1500 and _series_in(parsed, "workload_extra_") == said["extra"], \
                "every series the process registered is seen"
            assert value(parsed, "outrider_hook_dropped_total", reason="series_limit") == \
                said["dropped"]["series_limit"] > 0, "past the per-process cap: counted, by reason"
        hold.touch()
        assert p.wait(timeout=60) == 0
    finally:
        release(p, hold, c)
    err = p.stderr.read().decode() if p.stderr else ""
    assert "Traceback" not in err


def test_past_the_format_limit_series_are_left_out_counted_once_and_the_header_keeps_coming(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The format's real limit (32 MiB of directory) is too much to fill in a unit test: lowered here, the same
    # code paths run (regrow to the limit, then leave series out).
    monkeypatch.setattr(spool, "MAX_DIRECTORY_BYTES", 128 * 1024)
    monkeypatch.setattr(spool, "MAX_SHARD_BYTES", spool.HEADER_BYTES + 128 * 1024 + spool.MAX_DATA_BYTES)
    drop = Dropped()
    pub = ShardPublisher(str(tmp_path), True, drop)
    entries: list[list[object]] = [["outrider_train_steps_total", "counter", {}, 0, []]]
    entries += [["workload_x_total", "counter", {"k": f"{i:04d}" + "v" * 120}, i + 1, []] for i in range(2000)]
    values = [float(i) for i in range(2001)]
    header = dict(flags=0, stalls=0, heartbeat_ns=1, last_step_ns=1, steps=5, stalled_since_ns=0)
    for heartbeat in (1, 2, 3):
        header["heartbeat_ns"] = heartbeat
        assert pub.publish(4242, 7, {"rank": "0"}, entries, values, **header)
        assert pub.writer is not None
        snap = spool.decode(Path(pub.writer.path).read_bytes())
        assert snap.header.heartbeat_ns == heartbeat and snap.header.steps == 5, "the header is always written"
    assert pub.writer.directory_capacity == 128 * 1024, "grown to the limit first"
    assert pub.writer.generation == 1, "and not re-created at every flush once at the limit"
    kept = {s[2].get("k", ""): s[3][0] for s in snap.series}
    assert snap.series[0][0] == "outrider_train_steps_total", "the hook's own series kept first"
    assert all(float(int(k[:4]) + 1) == v for k, v in kept.items() if k), "kept series keep their values"
    left_out = 2001 - len(snap.series)
    assert 0 < left_out < 2000
    assert drop.counts["shard_full"] == left_out, "each series left out counted once, not once per flush"
    pub.close()


def test_a_reader_refuses_a_layout_that_does_not_fit_the_format(tmp_path: Path) -> None:
    w = spool.ShardWriter(str(tmp_path), 4242, 1)
    w.write(b'{"meta":{},"series":[]}', [1.0], flags=0, pid=4242, stalls=0, start_ns=1, heartbeat_ns=1,
            last_step_ns=0, steps=0, stalled_since_ns=0)
    good = bytearray(Path(w.path).read_bytes())
    struct.pack_into("<I", good, 8, 2)
    assert spool.decode(bytes(good)).header.data_offset == spool.DATA_OFFSET, "the layout as written is valid"
    for offset, fmt, bad in [(84, "<I", spool.MAX_DIRECTORY_BYTES + 4096),  # directory capacity past the limit
                             (88, "<Q", 4096 + 8),  # data inside the directory's space
                             (88, "<Q", spool.DATA_OFFSET + 3),  # unaligned data
                             (96, "<Q", spool.MAX_SHARD_BYTES + 8)]:  # a size past the limit
        data = bytearray(good)
        struct.pack_into("<I", data, 8, 2)  # a regrown shard's version: its layout is read
        struct.pack_into(fmt, data, offset, bad)
        with pytest.raises(spool.ShardFormatError):
            spool.decode(bytes(data))
    w.close()

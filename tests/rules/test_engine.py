"""The agent's rule engine on its own: refusal of rules outside the subset, the bounded store, alert state and
notifications across a restart, staleness, the stall alert's stack dump, and a clock that ignores wall-clock
jumps."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
import yaml

from outrider.ground.clock import Clock as SystemClock
from outrider.ground.config import Config
from outrider.metrics.catalog import CATALOG, Label, MetricDef
from outrider.metrics.family import Family, HistogramValue
from outrider.notify.base import Notification
from outrider.rules.engine import EvalClock, RuleEngine
from outrider.rules.rule import RuleLoadError, parse_groups
from outrider.wiring.alerting import rule_groups

GAUGE = MetricDef("test_value", "test.value", "1", "gauge", "a test gauge", (Label("gpu", "gpu"),), "self")


def groups(*rules: dict, interval: str = "1s") -> list:
    return parse_groups({"groups": [{"name": "g", "interval": interval, "rules": list(rules)}]}, "test")


def fam(values: dict[str, float]) -> list[Family]:
    f = Family(GAUGE)
    for gpu, v in values.items():
        f.add(v, gpu)
    return [f]


class Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.mark.parametrize(("expr", "construct"), [
    ("max_over_time(rate(x[5m])[30m:1m])", "subquery"),
    ("x @ 1700000000", "@ modifier"),
    ("sort_desc(x)", "sort_desc"),
    ("count_values(\"v\", x)", "count_values"),
    ("x atan2 y", "atan2"),
])
def test_rules_outside_the_subset_are_refused_naming_rule_and_construct(expr: str, construct: str) -> None:
    with pytest.raises(RuleLoadError) as e:
        groups({"alert": "Clever", "expr": expr, "for": "1m"})
    text = str(e.value)
    assert "'Clever'" in text and construct in text and "still works in Prometheus" in text


def test_templates_outside_the_subset_are_refused_at_load_time() -> None:
    with pytest.raises(RuleLoadError, match=r"'T'.*annotation summary.*control structures"):
        groups({"alert": "T", "expr": "x > 0", "annotations": {"summary": "{{ range $labels }}x{{ end }}"}})
    with pytest.raises(RuleLoadError, match="unsupported template function 'query'"):
        groups({"alert": "T", "expr": "x > 0", "annotations": {"summary": "{{ query \"up\" | first }}"}})


def test_the_builtin_catalog_loads_and_its_store_keeps_only_what_rules_read() -> None:
    engine = RuleEngine(rule_groups(Config()), 15.0, clock=Clock())
    kept = engine.retention_ms
    assert "outrider_gpu_memory_used_bytes" in kept and "outrider_host_cpu_utilization_ratio" in kept
    assert "outrider_process_cpu_seconds_total" not in kept  # no rule reads it: never stored
    # the longest window: 6 h of the latency histogram for the slow SLO burn, plus one evaluation interval
    assert kept["outrider_request_duration_seconds_bucket"] == 6 * 3_600_000 + 15_000
    # a recorded series: the hour around this time yesterday (offset 23h30m) the latency alert compares with
    assert kept["outrider:request_latency_seconds:p99_5m"] == 23 * 3_600_000 + 30 * 60_000 + 3_600_000 + 15_000
    # the baselines read a day of hourly means, in the recording group's own 30 s interval
    assert kept["outrider:train_rank_step_seconds:mean1h"] == 24 * 3_600_000 + 30_000
    # the error budget's ticket reads 3 days of failed requests, and of the recorded traffic it is reckoned on
    assert kept["outrider_requests_total"] == 3 * 86_400_000 + 15_000
    assert kept["outrider:requests:rate5m"] == 3 * 86_400_000 + 15_000  # read by a group of the default interval


def test_the_store_is_trimmed_to_the_rules_windows() -> None:
    clock = Clock()
    engine = RuleEngine(groups({"alert": "A", "expr": "rate(test_value[2m]) > 0"}), 1.0, clock=clock)
    for i in range(600):
        clock.ms += 1000
        engine.ingest(fam({"0": float(i)}), clock.ms)
        engine.evaluate(clock.ms)
    times = [t for _, s in engine.store.candidates("test_value") for t in s.times]
    assert len(times) <= 2 * 60 + 2 and clock.ms - min(times) <= 2 * 60_000 + 1000


def test_a_sample_older_than_its_series_newest_is_dropped_and_counted() -> None:
    clock = Clock()
    engine = RuleEngine(groups({"alert": "A", "expr": "test_value > 0"}), 1.0, clock=clock)

    def dropped() -> float:
        family = next(f for f in engine.families() if f.defn.name == "outrider_rule_store_out_of_order_samples_total")
        return family.samples[0][1]  # type: ignore[return-value]

    engine.ingest(fam({"0": 1.0, "1": 1.0}), clock.ms)
    engine.ingest(fam({"0": 2.0}), clock.ms - 1000)  # stamped before its series' newest: rules never see it
    assert dropped() == 1
    assert [list(s.values) for _, s in engine.store.candidates("test_value")] == [[1.0], [1.0]]


def engine_with_state(tmp_path: Path, clock: Clock, sent: list[Notification]) -> RuleEngine:
    rules = groups({"alert": "Hot", "expr": "test_value > 80", "for": "2s", "labels": {"severity": "warning"},
                    "annotations": {"summary": "GPU {{ $labels.gpu }} at {{ $value }}"}})
    return RuleEngine(rules, 1.0, str(tmp_path), notify=sent.append, instance="node-1", clock=clock)


def run(engine: RuleEngine, clock: Clock, values: dict[str, float], seconds: int) -> None:
    for _ in range(seconds):
        clock.ms += 1000
        engine.on_sweep(fam(values))


def test_pending_firing_resolved_and_state_across_a_restart(tmp_path: Path) -> None:
    clock, sent = Clock(), []
    first = engine_with_state(tmp_path, clock, sent)
    run(first, clock, {"0": 90.0, "1": 10.0}, 2)
    assert sent == [] and [a.state for _, a in first.active_alerts()] == ["pending"]
    run(first, clock, {"0": 91.0, "1": 10.0}, 2)
    assert [(n.event, n.labels["gpu"], n.annotations["summary"]) for n in sent] == [("firing", "0", "GPU 0 at 91")]
    assert sent[0].labels == {"alertname": "Hot", "gpu": "0", "instance": "node-1", "job": "outrider",
                              "severity": "warning"}
    # the agent stops and starts again: the alert is still firing, and is not paged again
    first.close()
    second = engine_with_state(tmp_path, clock, sent)
    assert [a.state for _, a in second.active_alerts()] == ["firing"]
    run(second, clock, {"0": 92.0, "1": 10.0}, 3)
    assert len(sent) == 1
    run(second, clock, {"0": 50.0, "1": 10.0}, 1)
    assert [(n.event, n.fingerprint) for n in sent] == [("firing", sent[0].fingerprint),
                                                        ("resolved", sent[0].fingerprint)]
    assert sent[1].ends_at > sent[1].starts_at


def test_a_resolve_owed_before_a_restart_is_sent_after_it(tmp_path: Path) -> None:
    clock, sent = Clock(), []
    first = engine_with_state(tmp_path, clock, sent)
    run(first, clock, {"0": 95.0}, 4)
    first.close()
    second = engine_with_state(tmp_path, clock, sent)
    run(second, clock, {"0": 1.0}, 1)
    assert [n.event for n in sent] == ["firing", "resolved"]


def test_a_vanished_series_resolves_at_once_through_staleness(tmp_path: Path) -> None:
    clock, sent = Clock(), []
    engine = engine_with_state(tmp_path, clock, sent)
    run(engine, clock, {"0": 95.0}, 4)
    run(engine, clock, {}, 1)  # the GPU is gone from the sweep (the family is there, the series is not)
    assert [n.event for n in sent] == ["firing", "resolved"]


def test_the_store_snapshot_keeps_rate_windows_across_a_restart(tmp_path: Path) -> None:
    clock, sent = Clock(), []
    rules = groups({"alert": "Growing", "expr": "rate(test_value[30s]) > 0.5"})
    first = RuleEngine(rules, 1.0, str(tmp_path), notify=sent.append, clock=clock)
    for i in range(40):
        clock.ms += 1000
        first.on_sweep(fam({"0": float(i)}))
    assert [n.event for n in sent] == ["firing"]
    first.close()
    second = RuleEngine(groups({"alert": "Growing", "expr": "rate(test_value[30s]) > 0.5"}), 1.0, str(tmp_path),
                        notify=sent.append, clock=clock)
    clock.ms += 1000
    second.on_sweep(fam({"0": 40.0}))  # one new sample: the window still has the old ones
    assert [n.event for n in sent] == ["firing"]


def test_a_stall_alert_carries_the_stack_dump(tmp_path: Path) -> None:
    dump = str(tmp_path / "1234.stacks.txt")
    text = 'Thread 0x1 (most recent call first):\n  File "train.py", line 42 in wait_for_batch\n'
    clock, sent = Clock(), []
    rules = groups({"alert": "TrainingStalled", "expr": "outrider_hook_stalled == 1",
                    "annotations": {"summary": "stalled"}})
    # the stacks as the hook collector read them from the spool (its owner checked, never a link)
    engine = RuleEngine(rules, 1.0, None, notify=sent.append, clock=clock,
                        stack_dumps=lambda: [(1234, "0", dump, text), (99, "1", "/elsewhere", "rank 1's")])
    stalled = Family("outrider_hook_stalled").add(1, "0", "").add(0, "1", "")
    clock.ms += 1000
    engine.on_sweep([stalled])
    assert len(sent) == 1
    assert "train.py\", line 42 in wait_for_batch" in sent[0].annotations["stack_dump"]
    assert "rank 1's" not in sent[0].annotations["stack_dump"], "only the stalled rank's stacks"
    assert sent[0].annotations["stack_dump_file"] == dump


def test_histograms_are_stored_as_buckets_sum_and_count() -> None:
    clock, sent = Clock(), []
    rules = groups(
        {"record": "p99", "expr": "histogram_quantile(0.99, rate(outrider_request_duration_seconds_bucket[10s]))"},
        {"alert": "Slow", "expr": "p99 > 0.05 and on () rate(outrider_request_duration_seconds_count[10s]) > 5",
         "annotations": {"summary": "{{ $value | humanizeDuration }}"}})
    engine = RuleEngine(rules, 1.0, None, notify=sent.append, clock=clock)
    defn = CATALOG["outrider_request_duration_seconds"]
    for i in range(12):
        clock.ms += 1000
        h = Family(defn).add(HistogramValue((0.1, 0.5), (10 * i, 0, 0), 0.05 * 10 * i), *[""] * len(defn.labels))
        engine.on_sweep([h])
    assert [n.annotations["summary"] for n in sent] == ["99ms"]
    assert "outrider_request_duration_seconds_sum" not in engine.retention_ms  # no rule reads it


def test_the_evaluation_clock_ignores_wall_clock_jumps() -> None:
    offset = [0.0]
    clock = EvalClock(SystemClock(wall=lambda: time.time() + offset[0]))
    before = clock.now_ms()
    offset[0] = -3600  # the wall clock stepped back an hour
    after = clock.now_ms()
    offset[0] = 86400
    later = clock.now_ms()
    assert 0 <= after - before < 5000 and 0 <= later - after < 5000
    assert abs(EvalClock(SystemClock(wall=lambda: time.time() + offset[0])).now_ms() - later - 86400_000) < 5000, \
        "anchored to the wall clock when made"


def test_the_builtin_rules_take_the_tunables(tmp_path: Path) -> None:
    cfg = Config(rule_settings=("GPUMemoryNearlyFull.ratio=0.9", "GPUMemoryNearlyFull.for=2m"))
    rule = next(r for g in rule_groups(cfg) for r in g.rules if r.name == "GPUMemoryNearlyFull")
    assert "> 0.9" in rule.expr_text and rule.hold_ms == 120_000
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"alert": "S", "expr": "x[5m:1m]"}]}]}))
    from outrider.ground.config import ConfigError

    with pytest.raises(ConfigError, match=r"rule_files:.*'S'.*subquery"):
        rule_groups(Config(rule_files=("builtin", str(bad))))


def test_an_unusable_state_dir_degrades_instead_of_stopping_the_agent(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from outrider.wiring.alerting import Alerting

    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the directory should be: makedirs fails, as on a read-only root
    with caplog.at_level("ERROR"):
        alerting = Alerting(Config(state_dir=str(blocker / "state")))
    assert alerting.state_dir and alerting.state_dir != str(blocker / "state")
    assert "is unusable" in caplog.text and "will not survive a restart" in caplog.text
    alerting.stop(1.0)


def test_wall_clock_jumps_change_neither_for_durations_nor_rates() -> None:
    """The real evaluation clock, the wall clock stepped back an hour and then forward a day while alerts are
    pending: `for` runs on monotonic time, and rates see no gap or reordering."""
    sent: list[Notification] = []
    rules = groups(
        {"alert": "Short", "expr": "test_value > 0", "for": "300ms"},
        {"alert": "Long", "expr": "test_value > 0", "for": "1h"},
        {"alert": "RateOff", "expr": "(rate(test_value[1s]) < 4 or rate(test_value[1s]) > 25) "
                                     "and count_over_time(test_value[1s]) >= 8"},
        interval="50ms")
    offset = [0.0]
    wall = SystemClock(wall=lambda: time.time() + offset[0])
    engine = RuleEngine(rules, 0.05, None, notify=sent.append, clock=EvalClock(wall).now_ms)
    value = 0.0
    for step in [-3600.0] * 8 + [86400.0] * 30:
        offset[0] = step
        value += 1.0  # a counter growing 10/s of monotonic time
        engine.on_sweep(fam({"0": value}))
        time.sleep(0.1)
    states = {r.name: [a.state for a in r.active.values()] for _, r in engine.alerting}
    assert states["Short"] == ["firing"]  # fired after 300 ms, though the wall clock went back an hour
    assert states["Long"] == ["pending"]  # did not fire, though the wall clock went forward a day
    assert [n.alertname for n in sent] == ["Short"]  # no RateOff: the rate stayed about 10/s throughout


def test_an_agent_without_rules_loads_no_rule_machinery() -> None:
    import subprocess
    import sys

    code = ("import sys; from outrider.ground.config import Config; from outrider.wiring.agent import Agent; "
            "a = Agent(Config(rule_files=(), listen='127.0.0.1:0', collectors=('host',))); "
            "print([m for m in ('promql_parser', 'yaml', 'outrider.rules.engine', 'outrider.notify') "
            "if m in sys.modules], a.alerting)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] None"


def test_re_sends_carry_the_current_annotations_and_the_resolve_the_last(tmp_path: Path) -> None:
    clock, sent = Clock(), []
    engine = engine_with_state(tmp_path, clock, sent)
    run(engine, clock, {"0": 90.0}, 4)
    run(engine, clock, {"0": 99.0}, 1)
    assert [n.annotations["summary"] for n in engine.firing_notifications()] == ["GPU 0 at 99"]
    assert [n.annotations["summary"] for n in sent] == ["GPU 0 at 90"]  # the page itself is not repeated
    run(engine, clock, {"0": 1.0}, 1)
    assert sent[-1].event == "resolved" and sent[-1].annotations["summary"] == "GPU 0 at 99"


def test_the_standalone_agent_evaluates_rules_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.commands import standalone
    from outrider.ground.config import load

    for name in [k for k in __import__("os").environ if k.startswith("OUTRIDER_")]:
        monkeypatch.delenv(name)
    assert standalone.standalone_config(load(), None, None).rule_files == ()
    monkeypatch.setenv("OUTRIDER_RULE_FILES", "builtin")
    assert standalone.standalone_config(load(), None, None).rule_files == ("builtin",)


def test_a_rule_that_breaks_is_counted_and_the_others_still_evaluate(monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.rules import promql

    clock, sent = Clock(), []
    rules = groups({"alert": "Breaks", "expr": "abs(test_value) > 0"},
                   {"alert": "Works", "expr": "test_value > 0", "annotations": {"summary": "{{ printf \"%d\" }}"}})
    engine = RuleEngine(rules, 1.0, None, notify=sent.append, clock=clock)
    real = promql._simple_function

    def broken(name: str, extra: list[float]):  # type: ignore[no-untyped-def]
        if name == "abs":
            raise ZeroDivisionError("a bug")
        return real(name, extra)

    monkeypatch.setattr(promql, "_simple_function", broken)
    run(engine, clock, {"0": 1.0}, 2)
    assert engine.failures == {"Breaks": 2}
    assert [n.alertname for n in sent] == ["Works"]
    assert sent[0].annotations["summary"].startswith("<error expanding template:")
    text = __import__("outrider.metrics.exposition", fromlist=["render"]).render(engine.families()).decode()
    assert 'outrider_rule_evaluation_failures_total{rule="Breaks"} 2' in text


def test_a_clock_corrected_backwards_across_a_restart_does_not_blind_the_rules(tmp_path: Path) -> None:
    """The first agent ran with the wall clock an hour fast; the second starts after the correction. Fresh samples
    must be taken in at once (they were 'out of order' behind the snapshot's for the hour), and a restored alert
    must not have become active in the future."""
    clock, sent = Clock(), []
    clock.ms += 3_600_000
    first = engine_with_state(tmp_path, clock, sent)
    run(first, clock, {"0": 10.0, "1": 95.0}, 5)
    assert [(n.event, n.labels["gpu"]) for n in sent] == [("firing", "1")]
    first.close()
    clock.ms -= 3_600_000  # NTP stepped the clock back while the agent was down
    second = engine_with_state(tmp_path, clock, sent)
    assert all(a.active_at <= clock.ms and a.fired_at <= clock.ms for _, a in second.active_alerts())
    run(second, clock, {"0": 95.0, "1": 95.0}, 4)
    assert ("firing", "0") in [(n.event, n.labels["gpu"]) for n in sent], "fresh samples are seen"
    assert [(n.event, n.labels["gpu"]) for n in sent].count(("firing", "1")) == 1, "no second page for gpu 1"


@pytest.mark.parametrize("sweep_ms", [1000, 700, 15_000])
def test_groups_are_evaluated_on_the_grid_of_their_interval_whatever_the_sweep_period(sweep_ms: int) -> None:
    """A 15 s group evaluated by an agent sweeping every second was evaluated every 14 s (due 13.5 s after the last
    evaluation, taken by the next sweep), so a `for: 30s` fired after 42 s instead of 30. On the grid: the
    evaluations average the group's interval, each within one sweep of its grid time, never two in one interval."""
    clock = Clock()
    engine = RuleEngine(groups({"alert": "A", "expr": "test_value > 0"}, interval="15s"), 15.0, clock=clock)
    start, times = clock.ms, []
    for k in range(600_000 // sweep_ms):  # ten minutes of sweeps, each with up to a tenth of a second of jitter
        clock.ms = start + k * sweep_ms + (37 * k) % 100
        before = engine.evaluations
        engine.on_sweep(fam({"0": 1.0}))
        if engine.evaluations > before:
            times.append(clock.ms - start)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert abs(sum(gaps) / len(gaps) - 15_000) <= sweep_ms / len(gaps) + 100, gaps
    assert all(abs(t - round(t / 15_000) * 15_000) <= max(sweep_ms, 1500) for t in times), times
    assert min(gaps) >= 15_000 - 1500 - 100 - sweep_ms % 15_000, gaps

"""Config: defaults < YAML file < OUTRIDER_* environment < flags; every error names key, source, expectation."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from outrider.collectors import resolve
from outrider.ground.config import BOUNDS, Config, ConfigError, load, otlp_enabled, to_yaml
from outrider.hook.progress import Progress
from outrider.hook.registry import Registry
from outrider.hook.settings import KEYS
from tests.helpers import REPO, outrider_cmd


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "outrider.yaml"
    p.write_text(text)
    return str(p)


def test_defaults_when_nothing_is_set() -> None:
    loaded = load(env={})
    assert loaded.config == Config()
    assert loaded.config.listen_address == ("127.0.0.1", 9477), "listens on loopback unless told otherwise"
    assert set(loaded.sources.values()) == {"default"}


def test_precedence_defaults_file_environment_flags(tmp_path: Path) -> None:
    f = write(tmp_path, "interval_s: 2\nprocess_top_n: 3\nlisten: 127.0.0.1:1234\n")
    env = {"OUTRIDER_PROCESS_TOP_N": "7", "OUTRIDER_LISTEN": "127.0.0.1:2345"}
    loaded = load(file=f, env=env, flags={"listen": "0.0.0.0:3456"}, flag_names={"listen": "--listen"})
    c = loaded.config
    assert (c.interval_s, c.process_top_n, c.listen) == (2.0, 7, "0.0.0.0:3456")
    assert loaded.sources["interval_s"] == f"file {f}"
    assert loaded.sources["process_top_n"] == "environment OUTRIDER_PROCESS_TOP_N"
    assert loaded.sources["listen"] == "flag --listen"
    assert loaded.sources["log_level"] == "default"


def test_config_file_from_environment(tmp_path: Path) -> None:
    f = write(tmp_path, "filesystems: [/, /data]\n")
    assert load(env={"OUTRIDER_CONFIG": f}).config.filesystems == ("/", "/data")


def test_unknown_key_names_it_its_source_and_a_suggestion(tmp_path: Path) -> None:
    f = write(tmp_path, "intervl_s: 3\n")
    with pytest.raises(ConfigError) as e:
        load(file=f, env={})
    msg = str(e.value)
    assert f"file {f}" in msg and "'intervl_s'" in msg and "did you mean 'interval_s'" in msg


@pytest.mark.parametrize(("key", "raw", "expected"), [
    ("interval_s", "-1", "a number from 0.05 to 3600"),
    ("interval_s", "soon", "a number from 0.05 to 3600"),
    ("interval_s", "1e308", "a number from 0.05 to 3600"),
    ("interval_s", "1e-300", "a number from 0.05 to 3600"),
    ("shutdown_timeout_s", "1e308", "a number from 0.1 to 600"),
    ("flush_interval_s", "1e308", "a number from 0.05 to 3600"),
    ("flush_interval_s", "nan", "a number from 0.05 to 3600"),
    ("listen", "9477", "host:port"),
    ("listen", "127.0.0.1:99999", "a port from 0 to 65535"),
    ("process_top_n", "ten", "a whole number from 0 to 10000"),
    ("otlp_protocol", "udp", "one of http/protobuf, grpc"),
    ("log_level", "loud", "one of debug, info, warning, error"),
    ("disk_exclude", "([", "a valid regular expression"),
    ("collectors", "host,GPU!", "collector names"),
    ("pids", "12,abc", "a list of process ids"),
])
def test_bad_environment_value_names_key_source_and_expectation(key: str, raw: str, expected: str) -> None:
    name = "OUTRIDER_" + key.upper()
    with pytest.raises(ConfigError) as e:
        load(env={name: raw})
    msg = str(e.value)
    assert f"environment {name}" in msg and f"'{key}'" in msg and expected in msg and repr(raw) in msg


def test_bad_file_value_and_wrong_type(tmp_path: Path) -> None:
    f = write(tmp_path, "filesystems: {a: 1}\n")
    with pytest.raises(ConfigError, match=r"file .*: key 'filesystems': expected a list of strings"):
        load(file=f, env={})


def test_yaml_syntax_error_gives_line(tmp_path: Path) -> None:
    f = write(tmp_path, "interval_s: 2\nlisten: [unclosed\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load(file=f, env={})


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    f = write(tmp_path, "- interval_s\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load(file=f, env={})


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(file=str(tmp_path / "nope.yaml"), env={})


def test_collector_toggles_apply_over_the_configured_set() -> None:
    loaded = resolve(load(env={"OUTRIDER_COLLECTORS": "host,self"}), [("process", True), ("host", False)])
    assert loaded.config.collectors == ("self", "process")
    with pytest.raises(ConfigError, match="unknown collector"):
        resolve(load(env={}), [("nvidia", True)])
    with pytest.raises(ConfigError, match=r"OUTRIDER_COLLECTORS: key 'collectors': unknown collector 'gpu2'"):
        resolve(load(env={"OUTRIDER_COLLECTORS": "host,gpu2"}))


def test_every_number_has_documented_bounds() -> None:
    import dataclasses

    numbers = {f.name for f in dataclasses.fields(Config) if f.type in ("float", "int")}
    assert numbers == set(BOUNDS), "every numeric key needs its bounds in config.BOUNDS"
    for key, b in BOUNDS.items():
        assert load(env={f"OUTRIDER_{key.upper()}": str(b.high)}).config.__getattribute__(key) == b.high
        with pytest.raises(ConfigError, match=f"key '{key}'"):
            load(env={f"OUTRIDER_{key.upper()}": str(b.high * 10 + 1)})


@pytest.mark.parametrize(("content", "expected"), [
    (b"interval_s: 2\n\xff\xfe\n", "not UTF-8 text"),
    (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
])
def test_unreadable_config_files_are_one_clear_error(tmp_path: Path, content: bytes, expected: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_bytes(content)
    with pytest.raises(ConfigError, match=expected):
        load(file=str(f), env={})
    r = subprocess.run(outrider_cmd("config", "check", str(f)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr


def test_a_fifo_as_the_config_file_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    r = subprocess.run(outrider_cmd("config", "check", str(fifo)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr


def test_standard_otel_variables_set_defaults_that_outrider_settings_override() -> None:
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_METRIC_EXPORT_INTERVAL": "2500"}
    c = load(env=env).config
    assert (c.otlp_protocol, c.otlp_interval_s) == ("grpc", 2.5)
    c = load(env={**env, "OUTRIDER_OTLP_PROTOCOL": "http/protobuf"}).config
    assert c.otlp_protocol == "http/protobuf"


def test_otlp_is_on_only_with_an_endpoint_and_off_with_exporter_none() -> None:
    assert not otlp_enabled(Config(), env={})
    assert otlp_enabled(Config(), env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert otlp_enabled(Config(otlp_endpoint="http://x:4318"), env={})
    assert not otlp_enabled(Config(otlp_endpoint="http://x:4318"), env={"OTEL_METRICS_EXPORTER": "none"})


def test_show_lists_every_key_with_its_source(tmp_path: Path) -> None:
    f = write(tmp_path, "interval_s: 2\n")
    text = to_yaml(resolve(load(file=f, env={"OUTRIDER_LOG_LEVEL": "debug"})))
    assert f"interval_s: 2.0  # file {f}" in text
    assert "log_level: debug  # environment OUTRIDER_LOG_LEVEL" in text
    assert ("collectors: [host, oom, process, gpu, hook, prometheus_multiproc, workload_metrics, annotated_pods, "
            "otlp_receiver, diagnosis, efficiency, alerts, self]  # default") in text


@pytest.mark.parametrize(("key", "raw"), [
    ("alertmanager_urls", "http://outrider:s3cretPW@am-0:9093,https://a:s3cretPW@am-1:9093/x"),
    ("otlp_endpoint", "https://collector:s3cretPW@otel.example.com:4318"),
    ("docs_url", "https://reader:s3cretPW@docs.example.com/outrider"),
])
def test_show_hides_the_password_of_a_url_in_any_key(key: str, raw: str) -> None:
    text = to_yaml(load(env={"OUTRIDER_" + key.upper(): raw}))
    line = next(ln for ln in text.splitlines() if ln.startswith(key + ":"))
    assert "s3cretPW" not in text and ":<secret>@" in line, line


@pytest.mark.parametrize(("url", "shown"), [
    ("https://u:pw@host/p?q#f", "https://u:<secret>@host/p?q#f"),
    ("https://u:p:w@host", "https://u:<secret>@host"),  # the password is everything after the first colon
    ("https://u@host/", "https://u@host/"),  # no password
    ("https://host/a:b@c", "https://host/a:b@c"),  # an @ in the path is no userinfo
    ("host:pw@x", "host:pw@x"),  # no scheme: not a URL
    ("https://a:b@c@host/", "https://a:<secret>@host/"),  # the last @ ends the userinfo
])
def test_redact_url_password_forms(url: str, shown: str) -> None:
    from outrider.ground.config import redact_url_password

    assert redact_url_password(url) == shown


def test_cli_config_check_exit_codes(tmp_path: Path) -> None:
    good = write(tmp_path, "interval_s: 2\n")
    r = subprocess.run(outrider_cmd("config", "check", good), capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("interval_s: never\n")
    r = subprocess.run(outrider_cmd("config", "check", str(bad)), capture_output=True, text=True)
    assert r.returncode == 2
    assert "key 'interval_s'" in r.stderr and "a number from" in r.stderr and "Traceback" not in r.stderr


def test_cli_flag_errors_name_the_flag() -> None:
    r = subprocess.run(outrider_cmd("config", "show", "--interval", "0"), capture_output=True, text=True)
    assert r.returncode == 2 and "flag --interval" in r.stderr
    r = subprocess.run(outrider_cmd("config", "show", "--no-collector.process", "--collector.host"),
                       capture_output=True, text=True)
    assert r.returncode == 0
    assert ("collectors: [host, oom, gpu, hook, prometheus_multiproc, workload_metrics, annotated_pods, otlp_receiver, "
            "diagnosis, efficiency, alerts, self]") in r.stdout


def test_cli_config_check_loads_the_rules_and_receivers_it_names(tmp_path: Path) -> None:
    receivers = tmp_path / "receivers.yaml"
    receivers.write_text("receivers:\n  - {name: oncall, type: pagerduty, routing_key_env: CHECK_PD_KEY}\n")
    cfg = write(tmp_path, f"receivers_file: {receivers}\nrule_settings: ['GPUMemoryNearlyFull.for=2m']\n")
    r = subprocess.run(outrider_cmd("config", "check", cfg), capture_output=True, text=True,
                       env={**os.environ, "CHECK_PD_KEY": "k" * 32})
    catalog = sum(len(g["rules"]) for g in yaml.safe_load((REPO / "alerts" / "outrider.rules.yaml").read_text())[
        "groups"])
    assert r.returncode == 0 and f"{catalog} rules, receivers: log, oncall" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(outrider_cmd("config", "check", cfg), capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "CHECK_PD_KEY"})
    assert r.returncode == 2 and "receiver 'oncall': routing_key_env names CHECK_PD_KEY, which is not set" in r.stderr
    bad_rules = tmp_path / "bad.rules.yaml"
    bad_rules.write_text("groups: [{name: g, rules: [{alert: Sub, expr: 'max_over_time(x[5m:1m])'}]}]\n")
    r = subprocess.run(outrider_cmd("config", "check", write(tmp_path, f"rule_files: [{bad_rules}]\n")),
                       capture_output=True, text=True)
    assert r.returncode == 2 and "'Sub'" in r.stderr and "subquery" in r.stderr and "Traceback" not in r.stderr


# --- every bound the docs state, just inside and just outside (item 2 of issue 27) ----------------------------
# The numbers as docs/configuration.md's table gives them, written here by hand: a change of any bound in the code
# (or of the table, which is generated from it) fails the test named for that key.
STATED_BOUNDS = {
    "interval_s": (0.05, 3600.0), "process_top_n": (0, 10_000), "otlp_interval_s": (0.1, 86400.0),
    "otlp_timeout_s": (0.1, 600.0), "shutdown_timeout_s": (0.1, 600.0), "collector_timeout_s": (0.1, 600.0),
    "workload_metrics_port": (0, 65535), "diagnosis_window_s": (0.1, 86400.0), "rule_interval_s": (0.1, 86400.0),
    "resend_interval_s": (0.1, 86400.0), "k8s_pod_resources_timeout_s": (0.05, 60.0),
    "pod_discovery_interval_s": (1.0, 3600.0),
    "startup_grace_s": (0.0, 2_592_000.0), "flush_interval_s": (0.05, 3600.0),
    "hook_max_series_per_metric": (1, 100_000), "stall_factor": (1.0, 10_000.0),
    "stall_floor_s": (1.0, 2_592_000.0), "first_step_timeout_s": (1.0, 2_592_000.0),
    "phase_timeout_s": (1.0, 2_592_000.0), "profile_hz": (0.0, 1000.0), "promql_compat": (2, 3),
    "flops_every_s": (0.0, 2_592_000.0), "cpu_peak_gflops": (0.0, 1e9), "cpu_peak_threads": (0, 1_000_000),
}
INTEGER_KEYS = {"process_top_n", "workload_metrics_port", "hook_max_series_per_metric", "promql_compat",
                "cpu_peak_threads"}


def test_every_bounded_key_is_stated() -> None:
    assert set(STATED_BOUNDS) == set(BOUNDS)


@pytest.mark.parametrize("key", sorted(STATED_BOUNDS))
def test_a_bound_holds_just_inside_and_is_refused_just_outside(key: str) -> None:
    import math

    low, high = STATED_BOUNDS[key]
    assert (BOUNDS[key].low, BOUNDS[key].high) == (low, high), f"{key}: the code's bounds are not the docs'"
    table = (REPO / "docs" / "configuration.md").read_text()
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| `{key}` |"))
    assert row.endswith(f"({low:,.10g} to {high:,.10g}) |"), row
    if key in INTEGER_KEYS:
        inside, outside = (low, high, low + 1, high - 1), (low - 1, high + 1)
    else:
        inside = (low, high, math.nextafter(low, math.inf), math.nextafter(high, -math.inf))
        outside = (math.nextafter(low, -math.inf), math.nextafter(high, math.inf))
    env = "OUTRIDER_" + key.upper()
    for v in inside:
        assert getattr(load(env={env: repr(v)}).config, key) == v, f"{key}={v!r} is within the bounds"
    for v in outside:
        with pytest.raises(ConfigError, match=re.escape(f"key '{key}': expected ") + ".*" +
                           re.escape(f"from {low:g} to {high:g}")):
            load(env={env: repr(v)})


def test_show_keeps_a_value_with_a_line_break_on_its_own_line_beside_its_source() -> None:
    import yaml

    text = to_yaml(load(env={"OUTRIDER_ALERT_JOB": "train\njob: evil", "OUTRIDER_SPOOL_DIR": "/a\n/b"}))
    lines = text.splitlines()
    job = next(ln for ln in lines if ln.startswith("alert_job:"))
    assert job == 'alert_job: "train\\njob: evil"  # environment OUTRIDER_ALERT_JOB', job
    assert not any(ln.startswith("job:") for ln in lines), "a line break cannot forge a key"
    assert len(lines) == len([ln for ln in lines if "  # " in ln]), "every key on one line, with its source"
    assert yaml.safe_load(job.split("  # ")[0]) == {"alert_job": "train\njob: evil"}
    assert yaml.safe_load(next(ln for ln in lines if ln.startswith("spool_dir:")).split("  # ")[0]) == {
        "spool_dir": "/a\n/b"}


def test_every_hook_setting_has_the_hooks_default_on_every_side() -> None:
    """The hook reads its keys without the agent (hook/settings.py); the agent's configuration, the registry and the
    stall judge take that default, so `outrider run` hands a child nothing it did not set (config.hook_environment
    compares with it). `listen` differs on purpose: the agent's own address, not that of an agent the hook starts."""
    shared = [k for k in KEYS if k in Config.__dataclass_fields__ and k != "listen"]
    assert len(shared) == len(KEYS) - 1
    assert {k: getattr(Config(), k) for k in shared} == {k: KEYS[k] for k in shared}
    assert Registry().max_series_per_metric == KEYS["hook_max_series_per_metric"]
    p = Progress()
    assert (p.stall_factor, p.stall_floor_s, p.first_step_timeout_s, p.phase_timeout_s) == (
        KEYS["stall_factor"], KEYS["stall_floor_s"], KEYS["first_step_timeout_s"], KEYS["phase_timeout_s"])

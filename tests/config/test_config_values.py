"""Config: each kind of value as the environment or a file gives it (addresses, booleans, lists, pids, label names,
paths, choices), the OpenTelemetry defaults, the file's size cap, the hook settings handed to a child, and where
state lives: what each accepts, what it turns it into, and what it refuses, saying what was expected."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from outrider.ground.config import (
    MAX_CONFIG_BYTES,
    Config,
    ConfigError,
    default_state_dir,
    hook_environment,
    k8s_identity,
    load,
    otlp_enabled,
    parse_listen,
    read_yaml_file,
    to_yaml,
)


def env_value(key: str, raw: str) -> Any:
    return getattr(load(env={"OUTRIDER_" + key.upper(): raw}).config, key)


def refused(key: str, raw: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(env={"OUTRIDER_" + key.upper(): raw})
    assert f"key '{key}': expected {expected}" in str(e.value), str(e.value)


@pytest.mark.parametrize(("text", "address"), [
    ("127.0.0.1:9477", ("127.0.0.1", 9477)),
    ("[::1]:9477", ("::1", 9477)),
    ("[fe80::1]:1", ("fe80::1", 1)),
    (":9477", ("0.0.0.0", 9477)),  # no host: every interface
    ("  localhost:0  ", ("localhost", 0)),
    ("h:65535", ("h", 65535)),
])
def test_a_listen_address_is_host_and_port(text: str, address: tuple[str, int]) -> None:
    assert parse_listen(text) == address


@pytest.mark.parametrize(("text", "message"), [
    ("h:65536", "a port from 0 to 65535"),
    ("h:123456", "host:port"),
    ("h", "host:port"),
    ("a:b:1", "host:port"),
    ("[::1]9477", "host:port"),
    ("h:", "host:port"),
])
def test_a_listen_address_without_a_port_in_range_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_listen(text)


@pytest.mark.parametrize(("raw", "value"), [
    ("1", True), ("true", True), (" YES ", True), ("On", True),
    ("0", False), ("false", False), ("No", False), (" off", False),
])
def test_booleans_in_every_spelling(raw: str, value: bool) -> None:
    assert env_value("alert_log", raw) is value


def test_a_boolean_that_is_neither_is_refused(tmp_path: Path) -> None:
    refused("alert_log", "maybe", "true or false")
    p = tmp_path / "c.yaml"
    p.write_text("alert_log: false\nstandalone: true\n")
    c = load(file=str(p), env={}).config
    assert (c.alert_log, c.standalone) == (False, True), "YAML's own booleans are taken as they are"


def test_a_string_key_refuses_mappings_lists_and_nothing(tmp_path: Path) -> None:
    for text in ("{a: 1}", "[a]", "null"):
        p = tmp_path / "c.yaml"
        p.write_text(f"training_job: {text}\n")
        with pytest.raises(ConfigError, match="key 'training_job': expected a string"):
            load(file=str(p), env={})
    p.write_text("training_job: 42\n")
    assert load(file=str(p), env={}).config.training_job == "42"


def test_lists_are_comma_separated_in_the_environment_and_lists_in_a_file(tmp_path: Path) -> None:
    assert env_value("filesystems", " /, ,/data ,") == ("/", "/data"), "blank items are dropped, items stripped"
    p = tmp_path / "c.yaml"
    p.write_text("filesystems: [' /a ', '', /b]\n")
    assert load(file=str(p), env={}).config.filesystems == ("/a", "/b")
    p.write_text("filesystems: [[/a]]\n")
    with pytest.raises(ConfigError, match="key 'filesystems': expected a string"):
        load(file=str(p), env={})
    p.write_text("filesystems: 3\n")
    with pytest.raises(ConfigError, match="expected a list of strings"):
        load(file=str(p), env={})


def test_pids_are_positive_integers(tmp_path: Path) -> None:
    assert env_value("pids", "12, 7") == (12, 7)
    p = tmp_path / "c.yaml"
    p.write_text("pids: 5\n")
    assert load(file=str(p), env={}).config.pids == (5,), "one pid as a YAML number"
    p.write_text("pids: [1, 2]\n")
    assert load(file=str(p), env={}).config.pids == (1, 2)
    for raw in ("0", "1,0", "-3", "1.5"):
        refused("pids", raw, "a list of process ids (positive integers)")


@pytest.mark.parametrize(("raw", "value"), [("pod", "pod"), (" _x9 ", "_x9"), ("A_b", "A_b"), ("_", "_")])
def test_owner_label_names_are_prometheus_label_names(raw: str, value: str) -> None:
    assert env_value("k8s_owner_pod_label", raw) == value


@pytest.mark.parametrize("raw", ["__pod", "9pod", "po-d", "", "pod name"])
def test_owner_label_names_that_prometheus_would_refuse_are_refused(raw: str) -> None:
    refused("k8s_owner_pod_label", raw, "a Prometheus label name")


@pytest.mark.parametrize(("raw", "value"), [
    ("/metrics", "/metrics"), (" /m ", "/m"), ("/!~", "/!~"),  # '!' and '~': the ends of printable ASCII
    ("", "/metrics"), ("   ", "/metrics"),  # empty: the default
])
def test_the_workload_metrics_path_is_a_url_path(raw: str, value: str) -> None:
    assert env_value("workload_metrics_path", raw) == value


@pytest.mark.parametrize("raw", ["metrics", "/a b", "/\x7f", "/é", "/a\tb"])
def test_a_workload_metrics_path_that_could_break_a_request_line_is_refused(raw: str) -> None:
    refused("workload_metrics_path", raw, "a URL path starting with /")


def test_choices_are_matched_without_case_or_blanks() -> None:
    assert env_value("otlp_protocol", " GRPC ") == "grpc"
    assert env_value("log_level", "Debug") == "debug"


def test_kubernetes_labels_come_from_the_downward_api_variables() -> None:
    c = load(env={"OUTRIDER_K8S_LABELS": "pod, node"}).config
    assert c.k8s_labels == ("pod", "node")
    assert k8s_identity(c, env={"POD_NAME": "p-0", "POD_NAMESPACE": "ns"}) == {"pod": "p-0", "node": ""}
    refused("k8s_labels", "pod,zone", "label names from: pod, namespace, node, container")


@pytest.mark.parametrize(("raw", "ok"), [("host,gpu_2", True), ("a", True), ("Host", False), ("2gpu", False),
                                         ("gpu-2", False), ("_x", False)])
def test_collector_names_are_lower_case_words(raw: str, ok: bool) -> None:
    if ok:
        assert env_value("collectors", raw) == tuple(raw.split(","))
    else:
        refused("collectors", raw, "collector names (lower-case words)")


def test_the_otlp_receiver_listens_only_when_given_an_address() -> None:
    assert env_value("otlp_receiver_listen", "") == ""
    assert env_value("otlp_receiver_listen", "127.0.0.1:4318") == "127.0.0.1:4318"
    refused("otlp_receiver_listen", "4318", "host:port")


def test_an_unknown_key_with_no_near_name_suggests_nothing() -> None:
    with pytest.raises(ConfigError) as e:
        load(env={"OUTRIDER_ZZZQQQ": "1"})
    assert "environment OUTRIDER_ZZZQQQ: unknown key 'zzzqqq'; known keys: interval_s, " in str(e.value)
    assert "did you mean" not in str(e.value)


def test_only_outrider_variables_are_read_and_config_and_disabled_are_not_keys(tmp_path: Path) -> None:
    loaded = load(env={"OUTRIDER_DISABLED": "1", "OUTRIDER_CONFIG": "", "XOUTRIDER_LOG_LEVEL": "debug",
                       "LOG_LEVEL": "debug"})
    assert loaded.config == Config() and set(loaded.sources.values()) == {"default"}


def test_flags_left_unset_are_skipped_and_a_flag_is_named_from_its_key() -> None:
    loaded = load(env={}, flags={"log_level": None, "process_top_n": 3})
    assert loaded.sources["log_level"] == "default"
    assert loaded.sources["process_top_n"] == "flag --process-top-n"
    with pytest.raises(ConfigError, match="flag --process-top-n: key 'process_top_n'"):
        load(env={}, flags={"process_top_n": "x"})


def test_the_metrics_protocol_variable_wins_over_the_general_one_and_each_is_named() -> None:
    loaded = load(env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"})
    assert loaded.config.otlp_protocol == "grpc"
    assert loaded.sources["otlp_protocol"] == "environment OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
    loaded = load(env={"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert loaded.sources["otlp_protocol"] == "environment OTEL_EXPORTER_OTLP_PROTOCOL"
    loaded = load(env={"OTEL_METRIC_EXPORT_INTERVAL": "100"})
    assert loaded.config.otlp_interval_s == 0.1
    assert loaded.sources["otlp_interval_s"] == "environment OTEL_METRIC_EXPORT_INTERVAL"
    with pytest.raises(ConfigError, match="environment OTEL_METRIC_EXPORT_INTERVAL: expected milliseconds, got 'soon'"):
        load(env={"OTEL_METRIC_EXPORT_INTERVAL": "soon"})
    with pytest.raises(ConfigError, match="OTEL_METRIC_EXPORT_INTERVAL: key 'otlp_interval_s'"):
        load(env={"OTEL_METRIC_EXPORT_INTERVAL": "99"})  # 0.099 s: below the bound


def test_prometheus_multiproc_dir_comes_from_prometheus_clients_variable(tmp_path: Path) -> None:
    loaded = load(env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert loaded.config.prometheus_multiproc_dir == str(tmp_path)
    assert loaded.sources["prometheus_multiproc_dir"] == "environment PROMETHEUS_MULTIPROC_DIR"
    assert load(env={"PROMETHEUS_MULTIPROC_DIR": ""}).sources["prometheus_multiproc_dir"] == "default"


def test_a_config_file_up_to_its_cap_is_read_and_one_byte_over_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    head = b"log_level: debug\n"
    p.write_bytes(head + b"#" * (MAX_CONFIG_BYTES - len(head)))
    assert os.path.getsize(p) == MAX_CONFIG_BYTES
    assert read_yaml_file(str(p)) == {"log_level": "debug"}
    p.write_bytes(head + b"#" * (MAX_CONFIG_BYTES - len(head) + 1))
    with pytest.raises(ConfigError, match=f"{MAX_CONFIG_BYTES + 1} bytes, more than a configuration needs "
                                          f"\\({MAX_CONFIG_BYTES} at most\\)"):
        read_yaml_file(str(p))


def test_an_empty_config_file_is_the_defaults(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("")
    assert read_yaml_file(str(p)) == {}
    p.write_text("# nothing\n")
    assert load(file=str(p), env={}).config == Config()


def test_a_tag_safe_load_refuses_is_said_with_its_position(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("a: !!python/object:os.system x\n")
    with pytest.raises(ConfigError, match=r"file .*c\.yaml: not valid YAML at line 1, column 4: "):
        read_yaml_file(str(p))


def test_the_hook_settings_handed_to_a_child_are_those_set_away_from_the_default_or_named() -> None:
    assert hook_environment(Config(), env={}) == {}
    c = load(env={"OUTRIDER_FLUSH_INTERVAL_S": "2.5", "OUTRIDER_SPOOL_DIR": "/x",
                  "OUTRIDER_LISTEN": "127.0.0.1:1"}).config
    assert hook_environment(c, env={}) == {"OUTRIDER_FLUSH_INTERVAL_S": "2.5"}, "never listen nor spool_dir"
    assert hook_environment(Config(), env={"OUTRIDER_STALL_FACTOR": "10"}) == {"OUTRIDER_STALL_FACTOR": "10.0"}


def test_state_lives_under_xdg_state_home_else_under_the_home(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_state_dir() == str(tmp_path / "state" / "outrider")
    monkeypatch.setenv("XDG_STATE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_state_dir() == str(tmp_path / ".local" / "state" / "outrider")


def test_otlp_is_on_with_the_metrics_endpoint_variable_and_off_with_none_in_any_case() -> None:
    assert otlp_enabled(Config(), env={"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://x:4318"})
    assert not otlp_enabled(Config(otlp_endpoint="http://x:4318"), env={"OTEL_METRICS_EXPORTER": " None "})
    assert otlp_enabled(Config(otlp_endpoint="http://x:4318"), env={"OTEL_METRICS_EXPORTER": "otlp"})


def test_show_writes_lists_and_numbers_as_yaml_with_their_sources() -> None:
    text = to_yaml(load(env={"OUTRIDER_PIDS": "3,4", "OUTRIDER_PROCESS_TOP_N": "5"}))
    lines = text.splitlines()
    assert "pids: [3, 4]  # environment OUTRIDER_PIDS" in lines
    assert "process_top_n: 5  # environment OUTRIDER_PROCESS_TOP_N" in lines
    assert "spool_trusted_uids: []  # default" in lines
    assert "training_job: ''  # default" in lines
    assert text.endswith("\n") and not text.endswith("\n\n")


# The converters of CONVERTERS are built when config is imported; these build them again, so that what they do is
# tested on the code as it is now (a mutation tool switches a mutant on only after the import).

def test_a_number_converter_gives_integers_for_integer_keys_and_floats_for_the_rest() -> None:
    from outrider.ground.config import _number

    top_n = _number("process_top_n", integer=True)
    assert top_n(" 5 ") == 5 and type(top_n(" 5 ")) is int
    interval = _number("interval_s")
    assert interval("2") == 2.0 and type(interval("2")) is float
    assert interval(0.05) == 0.05
    for bad, what in ((lambda: top_n("x"), "a whole number from 0 to 10000"),
                      (lambda: top_n(None), "a whole number from 0 to 10000"),
                      (lambda: interval("0.04"), "a number from 0.05 to 3600")):
        with pytest.raises(ValueError) as e:
            bad()
        assert str(e.value) == what


def test_a_choice_converter_matches_without_case_or_blanks_and_names_the_choices() -> None:
    from outrider.ground.config import _choice

    convert = _choice(("grpc", "http/protobuf"))
    assert convert(" GRPC ") == "grpc" and convert("http/protobuf") == "http/protobuf"
    with pytest.raises(ValueError) as e:
        convert("udp")
    assert str(e.value) == "one of grpc, http/protobuf"
    with pytest.raises(ValueError, match="a string"):
        convert(None)


def test_an_ipv6_address_may_be_written_in_upper_case() -> None:
    assert parse_listen("[FE80::AB]:9477") == ("FE80::AB", 9477)


def test_without_an_environment_given_the_processs_own_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from outrider.ground.config import HANDED_TO_HOOK

    for key in HANDED_TO_HOOK:
        monkeypatch.delenv("OUTRIDER_" + key.upper(), raising=False)
    monkeypatch.setenv("POD_NAME", "p-1")
    monkeypatch.setenv("OUTRIDER_STALL_FACTOR", "10")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318")
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    c = Config(k8s_labels=("pod",))
    assert k8s_identity(c) == {"pod": "p-1"}
    assert hook_environment(Config()) == {"OUTRIDER_STALL_FACTOR": "10.0"}
    assert otlp_enabled(Config())


def test_load_reads_the_processs_environment_when_given_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTRIDER_LOG_LEVEL", "error")
    monkeypatch.delenv("OUTRIDER_CONFIG", raising=False)
    loaded = load()
    assert loaded.config.log_level == "error" and loaded.sources["log_level"] == "environment OUTRIDER_LOG_LEVEL"


def test_a_port_past_65535_says_the_range_exactly() -> None:
    with pytest.raises(ValueError) as e:
        parse_listen("h:65536")
    assert str(e.value) == "a port from 0 to 65535"


def test_a_url_in_the_query_does_not_hide_the_password_before_it() -> None:
    from outrider.ground.config import redact_url_password

    assert redact_url_password("https://u:pw@h/cb?next=http://x/") == "https://u:<secret>@h/cb?next=http://x/"


def test_a_file_exactly_at_the_cap_is_read_to_its_last_byte(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    tail = b"\nlog_level: debug"
    p.write_bytes(b"#" * (MAX_CONFIG_BYTES - len(tail)) + tail)
    assert os.path.getsize(p) == MAX_CONFIG_BYTES
    assert read_yaml_file(str(p)) == {"log_level": "debug"}


def test_what_is_wrong_with_a_config_file_is_said_exactly(tmp_path: Path) -> None:
    def error(path: Path) -> str:
        with pytest.raises(ConfigError) as e:
            read_yaml_file(str(path))
        return str(e.value)

    assert error(tmp_path) == f"file {tmp_path}: not a regular file"
    missing = tmp_path / "missing.yaml"
    assert error(missing) == f"file {missing}: cannot read: No such file or directory"
    p = tmp_path / "c.yaml"
    p.write_text("interval_s: 2\nlisten: [unclosed\n")
    assert error(p) == f"file {p}: not valid YAML at line 3, column 1: expected ',' or ']', but got '<stream end>'"
    p.write_text("a: \x07\n")  # the reader's error has no position mark and no `problem`: its own words
    assert error(p) == (f"file {p}: not valid YAML: unacceptable character #x0007: special characters are not "
                        f"allowed\n  in \"<unicode string>\", position 3")
    p.write_text("- a\n- b\n")
    assert error(p) == f"file {p}: expected a mapping of keys to values at the top level, got list"


def test_a_flag_is_named_as_the_command_line_spells_it() -> None:
    loaded = load(env={}, flags={"interval_s": 2}, flag_names={"interval_s": "--interval"})
    assert loaded.sources["interval_s"] == "flag --interval"


def test_a_file_whose_size_stat_does_not_tell_is_refused_past_the_cap_not_parsed_cut_short() -> None:
    # /proc/self/status says 0 bytes to stat and holds far more than 16: read as far as the cap allows, it would be
    # parsed cut short (here a tab YAML refuses, elsewhere a mapping missing its last keys)
    if not os.path.isfile("/proc/self/status"):
        pytest.skip("no /proc")
    with pytest.raises(ConfigError) as e:
        read_yaml_file("/proc/self/status", max_bytes=16)
    assert str(e.value) == "file /proc/self/status: more than 16 bytes, more than a configuration needs"


def test_a_file_read_without_a_cap_is_read_whole(tmp_path: Path) -> None:
    p = tmp_path / "promtool-test.yaml"
    p.write_bytes(b"#" * 64 + b"\nrule_files: [a.yaml]\n")
    assert read_yaml_file(str(p), max_bytes=None) == {"rule_files": ["a.yaml"]}
    with pytest.raises(ConfigError, match="86 bytes, more than a configuration needs \\(85 at most\\)"):
        read_yaml_file(str(p), max_bytes=85)


def test_the_node_name_comes_from_the_downward_apis_node_name_and_outriders_own_wins() -> None:
    loaded = load(env={"NODE_NAME": " gpu-node-7 "})
    assert loaded.config.k8s_node_name == "gpu-node-7"
    assert loaded.sources["k8s_node_name"] == "environment NODE_NAME"
    loaded = load(env={"NODE_NAME": "gpu-node-7", "OUTRIDER_K8S_NODE_NAME": "gpu-node-8"})
    assert loaded.config.k8s_node_name == "gpu-node-8"
    assert loaded.sources["k8s_node_name"] == "environment OUTRIDER_K8S_NODE_NAME"
    assert load(env={"NODE_NAME": ""}).sources["k8s_node_name"] == "default"


def test_the_histogram_aggregation_comes_from_opentelemetrys_variable_and_outriders_own_wins() -> None:
    # OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION: explicit_bucket_histogram or
    # base2_exponential_bucket_histogram, as the OpenTelemetry exporter specification names them
    variable = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
    loaded = load(env={variable: "Explicit_Bucket_Histogram"})
    assert loaded.config.otlp_histogram_aggregation == "explicit_bucket_histogram"
    assert loaded.sources["otlp_histogram_aggregation"] == f"environment {variable}"
    loaded = load(env={variable: "explicit_bucket_histogram",
                       "OUTRIDER_OTLP_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram"})
    assert loaded.config.otlp_histogram_aggregation == "base2_exponential_bucket_histogram"
    assert loaded.sources["otlp_histogram_aggregation"] == "environment OUTRIDER_OTLP_HISTOGRAM_AGGREGATION"
    with pytest.raises(ConfigError) as e:
        load(env={variable: "exponential"})
    assert str(e.value).startswith(f"environment {variable}: key 'otlp_histogram_aggregation': expected one of "), \
        str(e.value)
    assert load(env={variable: ""}).sources["otlp_histogram_aggregation"] == "default"


@pytest.mark.parametrize(("raw", "value"), [
    ("https://10.96.0.1:443", "https://10.96.0.1:443"),
    (" http://apiserver.local/prefix ", "http://apiserver.local/prefix"),
    ("HTTPS://[fd00::1]:6443", "HTTPS://[fd00::1]:6443"),
    ("", ""),
])
def test_the_api_server_is_an_http_or_https_url_with_a_host(raw: str, value: str) -> None:
    assert env_value("k8s_api_server", raw) == value


@pytest.mark.parametrize(("raw", "expected"), [
    ("ftp://10.96.0.1", "an http(s) URL with a host, e.g. https://10.96.0.1:443"),
    ("10.96.0.1:443", "an http(s) URL with a host, e.g. https://10.96.0.1:443"),
    ("https://", "an http(s) URL with a host, e.g. https://10.96.0.1:443"),
    ("https://10.96.0.1/?watch=1", "an http(s) URL with a host, e.g. https://10.96.0.1:443"),
    ("https://10.96.0.1/#top", "an http(s) URL with a host, e.g. https://10.96.0.1:443"),
    ("https://10.96.0.1:https", "an http(s) URL with a numeric port"),
])
def test_an_api_server_that_is_no_http_url_with_a_host_is_refused(raw: str, expected: str) -> None:
    refused("k8s_api_server", raw, expected)


def test_peak_flops_is_checked_when_loaded_and_kept_as_written() -> None:
    assert env_value("peak_flops", " bf16=989e12,fp32=67e12 ") == "bf16=989e12,fp32=67e12"
    assert env_value("peak_flops", "") == ""
    refused("peak_flops", "bf16=fast", "a peak in FLOP/s (989e12), or dtype=FLOP/s pairs")


def test_show_keeps_a_value_with_a_line_break_on_its_one_line_beside_its_source(tmp_path: Path) -> None:
    long = "a\nb " + "x " * 100  # past yaml's default 80 columns, where it would fold the line
    p = tmp_path / "c.yaml"
    p.write_text('filesystems: ["/data\\nset", "/scratch"]\n')
    lines = to_yaml(load(file=str(p), env={"OUTRIDER_K8S_NODE_NAME": long})).splitlines()
    assert f'k8s_node_name: "a\\nb {"x " * 99}x"  # environment OUTRIDER_K8S_NODE_NAME' in lines
    assert f'filesystems: ["/data\\nset", "/scratch"]  # file {p}' in lines

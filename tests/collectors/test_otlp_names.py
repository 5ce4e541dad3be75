"""The OTLP receiver names metrics as the OpenTelemetry Collector's Prometheus translator does, name by name, against
the translator's own documented examples: every row of its README's transformation table and unit table, and every
full-normalization case of its unit tests (opentelemetry-collector-contrib pkg/translator/prometheus: README.md at
185c721f, normalize_name_test.go at 1ba49ba8, for normalize_name.go at 239be622; the namespace cases left out, the
receiver has no namespace). The expected names are the Collector's, typed here from those files, never computed: a
change to any rule fails the rows it touches."""

from __future__ import annotations

import re

import pytest

from outrider.collectors.otlp_receiver import PER_UNITS, UNITS, prometheus_name

GAUGE, COUNTER = ("gauge", False), ("sum", True)  # the translator's createGauge and createCounter (a monotonic sum)

# (OTLP name, unit, kind) -> the Prometheus name the Collector writes
COLLECTOR_EXAMPLES = [
    # README: "List of transformations to convert OpenTelemetry metrics to Prometheus metrics"
    ("(lambda).function.executions(#)", "", GAUGE, "lambda_function_executions"),
    ("system.filesystem.usage", "By", GAUGE, "system_filesystem_usage_bytes"),
    ("system.network.dropped", "{packets}", GAUGE, "system_network_dropped"),
    ("system.network.dropped", "packets", GAUGE, "system_network_dropped_packets"),
    ("system.memory.utilization", "1", GAUGE, "system_memory_utilization_ratio"),
    ("storage.filesystem.utilization", "%", GAUGE, "storage_filesystem_utilization_percent"),
    ("astro.light.speed", "m/s", GAUGE, "astro_light_speed_meters_per_second"),
    ("system.processes.created", "", COUNTER, "system_processes_created_total"),
    # normalize_name_test.go: TestByteCounter, TestWhiteSpaces, TestNonStandardUnitCounter
    ("system.io", "By", COUNTER, "system_io_bytes_total"),
    ("network_transmitted_bytes_total", "By", COUNTER, "network_transmitted_bytes_total"),
    ("\t system.filesystem.usage       ", "  By\t", GAUGE, "system_filesystem_usage_bytes"),
    ("system.network.dropped", "{packets}", COUNTER, "system_network_dropped_total"),
    # TestBrokenUnit, TestBrokenUnitCounter: a unit already a word of the name is not repeated
    ("system.network.packets.dropped", "packets", GAUGE, "system_network_packets_dropped"),
    ("system.network.packets", "packets", GAUGE, "system_network_packets"),
    ("system.network.dropped", "packets", COUNTER, "system_network_dropped_packets_total"),
    ("system.network.packets.dropped", "packets", COUNTER, "system_network_packets_dropped_total"),
    ("system.network.packets", "packets", COUNTER, "system_network_packets_total"),
    # TestRatio, TestHertz, TestPer, TestPercent, TestEmpty
    ("hw.gpu.memory.utilization", "1", GAUGE, "hw_gpu_memory_utilization_ratio"),
    ("hw.fan.speed_ratio", "1", GAUGE, "hw_fan_speed_ratio"),
    ("objects", "1", COUNTER, "objects_total"),
    ("hw.cpu.speed_limit", "Hz", GAUGE, "hw_cpu_speed_limit_hertz"),
    ("broken.metric.speed", "km/h", GAUGE, "broken_metric_speed_km_per_hour"),
    ("astro.light.speed_limit", "m/s", GAUGE, "astro_light_speed_limit_meters_per_second"),
    ("broken.metric.success_ratio", "%", GAUGE, "broken_metric_success_ratio_percent"),
    ("broken.metric.success_percent", "%", GAUGE, "broken_metric_success_percent"),
    ("test.metric.no_unit", "", GAUGE, "test_metric_no_unit"),
    ("test.metric.spaces", "   \t  ", GAUGE, "test_metric_spaces"),
    # TestUnsupportedRunes
    ("unsupported.metric.temperature", "°F", GAUGE, "unsupported_metric_temperature_F"),
    ("unsupported.metric.weird", "+=.:,!* & #", GAUGE, "unsupported_metric_weird"),
    ("unsupported.metric.redundant", "__test $/°C", GAUGE, "unsupported_metric_redundant_test_per_C"),
    # TestOtelReceivers: the Collector's own receivers' metrics
    ("active_directory.ds.replication.network.io", "By", COUNTER,
     "active_directory_ds_replication_network_io_bytes_total"),
    ("active_directory.ds.replication.sync.object.pending", "{objects}", COUNTER,
     "active_directory_ds_replication_sync_object_pending_total"),
    ("active_directory.ds.replication.object.rate", "{objects}/s", GAUGE,
     "active_directory_ds_replication_object_rate_per_second"),
    ("active_directory.ds.name_cache.hit_rate", "%", GAUGE, "active_directory_ds_name_cache_hit_rate_percent"),
    ("active_directory.ds.ldap.bind.last_successful.time", "ms", GAUGE,
     "active_directory_ds_ldap_bind_last_successful_time_milliseconds"),
    ("apache.current_connections", "connections", GAUGE, "apache_current_connections"),
    ("apache.workers", "connections", GAUGE, "apache_workers_connections"),
    ("apache.requests", "1", COUNTER, "apache_requests_total"),
    ("bigip.virtual_server.request.count", "{requests}", COUNTER, "bigip_virtual_server_request_count_total"),
    ("system.cpu.utilization", "1", GAUGE, "system_cpu_utilization_ratio"),
    ("system.disk.operation_time", "s", COUNTER, "system_disk_operation_time_seconds_total"),
    ("system.cpu.load_average.15m", "1", GAUGE, "system_cpu_load_average_15m_ratio"),
    ("memcached.operation_hit_ratio", "%", GAUGE, "memcached_operation_hit_ratio_percent"),
    ("mongodbatlas.process.asserts", "{assertions}/s", GAUGE, "mongodbatlas_process_asserts_per_second"),
    ("mongodbatlas.process.journaling.data_files", "MiBy", GAUGE,
     "mongodbatlas_process_journaling_data_files_mebibytes"),
    ("mongodbatlas.process.network.io", "By/s", GAUGE, "mongodbatlas_process_network_io_bytes_per_second"),
    ("mongodbatlas.process.oplog.rate", "GiBy/h", GAUGE, "mongodbatlas_process_oplog_rate_gibibytes_per_hour"),
    ("mongodbatlas.process.db.query_targeting.scanned_per_returned", "{scanned}/{returned}", GAUGE,
     "mongodbatlas_process_db_query_targeting_scanned_per_returned"),
    ("nginx.requests", "requests", GAUGE, "nginx_requests"),
    ("nginx.connections_accepted", "connections", GAUGE, "nginx_connections_accepted"),
    ("nsxt.node.memory.usage", "KBy", GAUGE, "nsxt_node_memory_usage_kilobytes"),
    ("redis.latest_fork", "us", GAUGE, "redis_latest_fork_microseconds"),
    # TestBuildCompliantNameWithNormalize (no namespace): a leading digit, doubled underscores, colons
    ("3.14 digits", "", GAUGE, "_3_14_digits"),
    ("envoy__rule_engine_zlib_buf_error", "", GAUGE, "envoy_rule_engine_zlib_buf_error"),
    (":foo::bar", "", GAUGE, "foo_bar"),
    (":foo::bar", "", COUNTER, "foo_bar_total"),
]

# README: "List of standard OpenTelemetry units that will be translated to Prometheus standard base units"
COLLECTOR_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
    "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
    "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius",
    "Hz": "hertz", "%": "percent",
}
# normalize_name.go's perUnitMap (the README documents `per` by example only)
COLLECTOR_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _id_word(text: str) -> str:
    """A test id's part: letters, digits and dots only. A node id with brackets, `::` or spaces in its parameters
    cannot be named back to pytest (mutmut runs each mutant's tests by node id)."""
    return re.sub(r"[^A-Za-z0-9.]+", "_", text.strip()).strip("_")


@pytest.mark.parametrize(("name", "unit", "kind", "expected"), COLLECTOR_EXAMPLES,
                         ids=[f"{i:02d}-{_id_word(n)}-{_id_word(u)}-{k[0]}"
                              for i, (n, u, k, _) in enumerate(COLLECTOR_EXAMPLES)])
def test_each_documented_example_is_named_as_the_collector_names_it(
        name: str, unit: str, kind: tuple[str, bool], expected: str) -> None:
    assert prometheus_name(name, unit, *kind) == expected


def test_every_unit_of_the_collectors_tables_and_no_other() -> None:
    assert {u: w for u, w in UNITS.items() if u != "1"} == COLLECTOR_UNITS
    assert PER_UNITS == COLLECTOR_PER_UNITS
    for unit, word in COLLECTOR_UNITS.items():
        assert prometheus_name("x", unit, "histogram") == f"x_{word}", unit
    for per, word in COLLECTOR_PER_UNITS.items():
        assert prometheus_name("x", f"By/{per}", "histogram") == f"x_bytes_per_{word}", per


def test_the_otlp_kind_decides_the_type_suffixes() -> None:
    """`ratio` on a gauge only (not an up-down counter, which the receiver also serves as a gauge); `total` on a
    monotonic sum only; histograms get the unit alone."""
    assert prometheus_name("pool.usage", "1", "sum", False) == "pool_usage"
    assert prometheus_name("pool.usage", "1", "gauge") == "pool_usage_ratio"
    assert prometheus_name("queue.depth_total", "", "sum", False) == "queue_depth_total"
    assert prometheus_name("rpc.duration", "ms", "histogram") == "rpc_duration_milliseconds"
    assert prometheus_name("rpc.duration", "ms", "exponential_histogram") == "rpc_duration_milliseconds"
    assert prometheus_name("requests", "1", "histogram") == "requests"


def test_the_rules_the_examples_leave_unexercised() -> None:
    """normalize_name.go's rules that no documented example reaches: a `per` word already in the name is not
    repeated; `total` and `ratio` anywhere in the name move to its end, once."""
    assert prometheus_name("http.requests_per_second", "{request}/s", "gauge") == "http_requests_per_second"
    assert prometheus_name("total.requests.total", "", "sum", True) == "requests_total"
    assert prometheus_name("ratio.cache_hit", "1", "gauge") == "cache_hit_ratio"


def test_a_name_outside_prometheus_grammar_is_never_produced() -> None:
    """Where the Collector keeps a non-ASCII letter (its one invalid output), its words are separated instead; a
    name with no word at all is "" (the receiver refuses it, counted)."""
    assert prometheus_name("metric_with_字符_foreign_characters", "ど", "gauge") == "metric_with_foreign_characters"
    assert prometheus_name("température.cœur", "Cel", "gauge") == "temp_rature_c_ur_celsius"
    assert prometheus_name("+++", "", "gauge") == ""
    assert prometheus_name("...", "s", "gauge") == "seconds"

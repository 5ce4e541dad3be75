"""The agent's configuration: one frozen dataclass, layered defaults < YAML file < OUTRIDER_* environment < flags.

Every value remembers where it came from, so `outrider config show` can say it and every error names the key,
its source and what was expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from outrider.ground import links, peaks, regex
from outrider.hook import settings as hook_settings

ENV_PREFIX = "OUTRIDER_"
LOG_LEVELS = ("debug", "info", "warning", "error")
OTLP_PROTOCOLS = ("http/protobuf", "grpc")
OTLP_HISTOGRAM_AGGREGATIONS = ("base2_exponential_bucket_histogram", "explicit_bucket_histogram")


class ConfigError(ValueError):
    """A bad configuration value or key; the message names the key, its source and what was expected."""


@dataclass(frozen=True)
class Config:
    interval_s: float = field(default=5.0, metadata={"help": "seconds between sweeps of all collectors"})
    listen: str = field(default="127.0.0.1:9477", metadata={
        "help": "host:port of /metrics, /healthz, /readyz (0.0.0.0 or [::] listens on all interfaces; port 0 "
                "picks a free one)"})
    collectors: tuple[str, ...] = field(default=(), metadata={
        "help": "collectors to run (empty: every collector enabled by default)"})
    proc_root: str = field(default="/proc", metadata={"help": "procfs mount (a fixture tree in tests)"})
    sys_root: str = field(default="/sys", metadata={"help": "sysfs mount"})
    filesystems: tuple[str, ...] = field(default=("/",), metadata={
        "help": "paths whose filesystem space is reported (add checkpoint and data directories)"})
    disk_exclude: str = field(default=r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]+|nvme\d+n\d+p)\d+$",
                              metadata={"help": "regex of block devices left out (partitions, loop, ram)"})
    network_exclude: str = field(default=r"^(lo|veth.*|docker\d*|br-.*|cali.*|flannel.*|cni.*|ifb\d+)$",
                                 metadata={"help": "regex of network interfaces left out"})
    process_top_n: int = field(default=10, metadata={
        "help": "watched processes reported one by one; the rest are summed under pid=\"other\""})
    process_command_arguments: bool = field(default=False, metadata={
        "help": "export watched processes' arguments too, secret-looking values <redacted> (by default the command "
                "label is the program and its script only)"})
    process_full_command: bool = field(default=False, metadata={
        "help": "export watched command lines whole and unredacted (an explicit opt-in: /metrics may be readable by "
                "every pod on the node)"})
    pids: tuple[int, ...] = field(default=(), metadata={
        "help": "roots of the process trees to watch (empty: every process visible to the agent)"})
    otlp_endpoint: str = field(default="", metadata={
        "help": "OTLP base URL; empty: use OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT if set, else no OTLP export"})
    otlp_protocol: str = field(default="http/protobuf", metadata={
        "help": "http/protobuf or grpc (grpc needs the 'grpc' extra); OTEL_EXPORTER_OTLP_PROTOCOL sets the "
                "default"})
    otlp_interval_s: float = field(default=15.0, metadata={
        "help": "seconds between OTLP exports (OTEL_METRIC_EXPORT_INTERVAL, in ms, sets the default)"})
    otlp_timeout_s: float = field(default=10.0, metadata={"help": "timeout of one OTLP export"})
    otlp_histogram_aggregation: str = field(default="base2_exponential_bucket_histogram", metadata={
        "help": "the recorded distributions (durations) on OTLP: base2_exponential_bucket_histogram (exponential "
                "histograms at their resolution, 1% error) or explicit_bucket_histogram (the classic buckets); "
                "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION sets the default"})
    shutdown_timeout_s: float = field(default=5.0, metadata={
        "help": "bound on the final sweep and flush after SIGTERM/SIGINT"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    # The hook's settings take their defaults from the hook (hook/settings.py, KEYS), which reads them without the
    # agent: one default, whichever side reads the key.
    spool_dir: str = field(default=hook_settings.KEYS["spool_dir"], metadata={
        "help": "directory of the hook's per-process shards (a shared emptyDir in a pod); empty: "
                "/tmp/outrider-spool-UID, or a fresh one per `outrider run`"})
    flush_interval_s: float = field(default=hook_settings.KEYS["flush_interval_s"], metadata={
        "help": "seconds between the hook's shard updates"})
    hook_max_series_per_metric: int = field(default=hook_settings.KEYS["hook_max_series_per_metric"], metadata={
        "help": "label sets one hook metric may have per process; more are dropped and counted"})
    stall_factor: float = field(default=hook_settings.KEYS["stall_factor"], metadata={
        "help": "a step is stalled after stall_factor x the recent median step time (and stall_floor_s)"})
    stall_floor_s: float = field(default=hook_settings.KEYS["stall_floor_s"], metadata={
        "help": "never call a stall before this many seconds"})
    k8s_labels: tuple[str, ...] = field(default=("pod", "namespace", "node", "container"), metadata={
        "help": "Kubernetes identity labels exported (from the Downward API variables POD_NAME, POD_NAMESPACE, "
                "NODE_NAME, CONTAINER_NAME) on outrider_k8s_info and as OTLP resource attributes; an allow-list"})
    collector_timeout_s: float = field(default=3.0, metadata={
        "help": "how long a sweep waits for a collector that may block (NVML) before going on without it; the "
                "deadline of the whole scrape of the workload's own /metrics (workload_metrics_port)"})
    diagnosis_window_s: float = field(default=30.0, metadata={
        "help": "seconds of sweeps the bottleneck diagnosis looks at"})
    runs_dir: str = field(default="", metadata={
        "help": "where `outrider run` keeps run records; empty: $XDG_DATA_HOME/outrider or ~/.local/share/outrider"})
    tls_cert_file: str = field(default="", metadata={
        "help": "serve /metrics over TLS with this certificate (PEM); a replaced certificate and key are served "
                "from the next connection (looked at once a second at most)"})
    tls_key_file: str = field(default="", metadata={"help": "the TLS certificate's private key (PEM)"})
    basic_auth_username: str = field(default="", metadata={
        "help": "require HTTP basic auth on /metrics with this user (health endpoints stay open for probes)"})
    basic_auth_username_file: str = field(default="", metadata={
        "help": "file holding the basic-auth user instead (a mounted Secret), read again when it changes"})
    basic_auth_password_file: str = field(default="", metadata={
        "help": "file holding the basic-auth password (a mounted Secret; never the password itself), read again "
                "when it changes: the old password stops working"})
    native_histograms: bool = field(default=True, metadata={
        "help": "answer a scraper that asks for the protobuf exposition (Prometheus with native histograms on) "
                "with it: the recorded distributions as native histograms, classic buckets beside them; false: "
                "the text formats only (Prometheus 2.42-2.44 keeps no classic buckets of a native histogram, and "
                "the rules query them)"})
    nvml_library: str = field(default="", metadata={
        "help": "path of libnvidia-ml.so.1 to load; empty: the driver's, found by soname"})
    rule_files: tuple[str, ...] = field(default=("builtin",), metadata={
        "help": "Prometheus rule files the agent evaluates itself ('builtin': Outrider's catalog, "
                "alerts/outrider.rules.yaml); empty: no alerting in the agent"})
    rule_settings: tuple[str, ...] = field(default=(), metadata={
        "help": "tunables for the built-in rules, as `outrider rules export --set` takes them "
                "(RULE.threshold=VALUE, RULE.for=DURATION)"})
    rule_interval_s: float = field(default=15.0, metadata={
        "help": "seconds between rule evaluations (a group's own interval, if longer, wins)"})
    promql_compat: int = field(default=3, metadata={
        "help": "evaluate rules as Prometheus 3 (left-open range windows, `.` matching newlines, le labels "
                "normalised, Kahan sums) or as Prometheus 2; see docs/alerting.md, Prometheus 2 and 3"})
    docs_url: str = field(default=links.DEFAULT_DOCS_URL, metadata={
        "help": "base URL of Outrider's documentation, where the dashboards' runbook links point (a mirror or an "
                "internal wiki; `outrider dashboards export/push` read it from the environment or --docs-url)"})
    alert_job: str = field(default="outrider", metadata={
        "help": "the job label the agent's own series carry for rule evaluation (Prometheus's target label)"})
    alert_instance: str = field(default="", metadata={
        "help": "the instance label for rule evaluation; empty: the host name"})
    state_dir: str = field(default="", metadata={
        "help": "where alert state, the rule store snapshot and the notification outbox live (a volume in a "
                "pod); empty: $XDG_STATE_HOME/outrider or ~/.local/state/outrider"})
    receivers_file: str = field(default="", metadata={
        "help": "YAML file of notification receivers (alertmanager, pagerduty, slack, webhook, log) with their "
                "routes; see docs/alerting.md"})
    alertmanager_urls: tuple[str, ...] = field(default=(), metadata={
        "help": "Alertmanager base URLs to send every alert to (a shortcut for alertmanager receivers)"})
    resend_interval_s: float = field(default=60.0, metadata={
        "help": "seconds between re-sends of firing alerts to Alertmanager (their lease is 4x this)"})
    alert_log: bool = field(default=True, metadata={"help": "log every alert transition on the agent's log"})
    standalone: bool = field(default=hook_settings.KEYS["standalone"], metadata={
        "help": "with no agent on the spool, an instrumented process starts one as a separate process (`outrider "
                "standalone`), which exits after the last instrumented process"})
    first_step_timeout_s: float = field(default=hook_settings.KEYS["first_step_timeout_s"], metadata={
        "help": "a training process with no first step this long after instrument() is stalled (hook)"})
    phase_timeout_s: float = field(default=hook_settings.KEYS["phase_timeout_s"], metadata={
        "help": "a declared phase (outrider.phase) open longer than this is a stall (hook)"})
    profile_hz: float = field(default=hook_settings.KEYS["profile_hz"], metadata={
        "help": "samples a second of the training loop thread's stack (where its time goes, its hottest lines); "
                "0: off (hook)"})
    flops_every_s: float = field(default=hook_settings.KEYS["flops_every_s"], metadata={
        "help": "seconds between two counts of a training step's FLOPs (one step counted: the first after two, "
                "then one this often or when the steps' shape changes), for the model FLOPs utilisation; 0: never "
                "(hook)"})
    training_job: str = field(default=hook_settings.KEYS["training_job"], metadata={
        "help": "the training job's name, labelling every hook series (training_job) so ranks of one job group "
                "across pods and nodes; empty: derived from the launcher or the platform (torchrun, JobSet, Ray, "
                "Volcano, Kubeflow, the pod's subdomain, an Indexed Job: docs/instrumenting.md, Training job "
                "identity) (hook)"})
    role: str = field(default=hook_settings.KEYS["role"], metadata={
        "help": "training or inference; empty: judged from what the process does (an optimizer, a DDP/FSDP "
                "wrapper or a process group built: training) (hook)"})
    spool_trusted_uids: tuple[int, ...] = field(default=hook_settings.KEYS["spool_trusted_uids"], metadata={
        "help": "uids whose shards the agent reads besides its own and those of the processes it watches; owners "
                "a configured spool may have besides the user and root"})
    k8s_pod_resources_socket: str = field(default="", metadata={
        "help": "the kubelet's PodResources socket (on a node: /var/lib/kubelet/pod-resources/kubelet.sock, "
                "mounted read-only); GPU, MIG device and GPU process series then carry the namespace, pod and "
                "container that own the device (needs the 'k8s' extra); empty: off"})
    k8s_pod_resources_timeout_s: float = field(default=1.0, metadata={
        "help": "deadline of one PodResources List call; past it the GPU series go on without owner labels"})
    k8s_owner_namespace_label: str = field(default="exported_namespace", metadata={
        "help": "label name of the owning pod's namespace on GPU and OOM-victim series (not 'namespace': the "
                "scrape's own)"})
    k8s_owner_pod_label: str = field(default="exported_pod", metadata={
        "help": "label name of the owning pod on GPU and OOM-victim series"})
    k8s_owner_container_label: str = field(default="exported_container", metadata={
        "help": "label name of the owning container on GPU and OOM-victim series"})
    exit_when_workload_exits: bool = field(default=False, metadata={
        "help": "stop (final sweep and flush) and exit 0 once the workload is gone: every process that published "
                "to the spool, and the trees of `pids`, seen at least once and none alive for a grace period "
                "(3 sweeps, at least 5 s), or seen exited between two sweeps; for a sidecar in a Job where Kubernetes "
                "has no native sidecars"})
    prometheus_multiproc_dir: str = field(default="", metadata={
        "help": "a service's prometheus_client multiprocess directory, whose metrics the agent merges and exports "
                "(PROMETHEUS_MULTIPROC_DIR sets the default); empty: none"})
    workload_metrics_port: int = field(default=0, metadata={
        "help": "port of the workload's own Prometheus endpoint on 127.0.0.1, scraped every sweep (within "
                "collector_timeout_s, at most 8 MiB) and exported beside the agent's; 0: the pod annotation "
                "outrider.dev/metrics-port names it, if pod_annotations_file is set, else none"})
    workload_metrics_path: str = field(default="/metrics", metadata={
        "help": "path of that endpoint (with the annotation: outrider.dev/metrics-path, else /metrics)"})
    pod_annotations_file: str = field(default="", metadata={
        "help": "the pod's annotations as a Downward API volume file (metadata.annotations; the chart mounts one "
                "for the sidecar), read every sweep for outrider.dev/metrics-port and outrider.dev/metrics-path"})
    scrape_annotated_pods: bool = field(default=False, metadata={
        "help": "node agent: scrape the Running pods of this node (k8s_node_name) that carry the annotation "
                "outrider.dev/metrics-port, at their pod IP, each sweep (all at once, the whole within "
                "collector_timeout_s, at most 1 MiB each and 8 MiB all together), their series labelled with the "
                "pod's namespace, pod and container (the k8s_owner_*_label names); the pods come from the API server "
                "(pods: list), asked every pod_discovery_interval_s"})
    pod_discovery_interval_s: float = field(default=30.0, metadata={
        "help": "seconds between two asks of the API server for this node's pods (scrape_annotated_pods); after a "
                "failed ask the last list is kept for 2 intervals"})
    k8s_node_name: str = field(default="", metadata={
        "help": "this node's name, whose pods scrape_annotated_pods scrapes (NODE_NAME, which the chart sets from "
                "the Downward API's spec.nodeName, sets the default)"})
    k8s_api_server: str = field(default="", metadata={
        "help": "base URL of the Kubernetes API server; empty: https://KUBERNETES_SERVICE_HOST:"
                "KUBERNETES_SERVICE_PORT, as every pod has it"})
    k8s_service_account_dir: str = field(default="/var/run/secrets/kubernetes.io/serviceaccount", metadata={
        "help": "where the service account's token (read again at each ask) and ca.crt are mounted"})
    otlp_receiver_listen: str = field(default="", metadata={
        "help": "host:port of a local OTLP/HTTP receiver (POST /v1/metrics) for the application's own OpenTelemetry "
                "metrics, exported beside the agent's; empty: none (e.g. 127.0.0.1:4318)"})
    startup_grace_s: float = field(default=900.0, metadata={
        "help": "with exit_when_workload_exits: stop all the same if no workload has appeared this long after the "
                "agent started (it failed before instrument(), or never calls it; in a pod sharing its PID "
                "namespace, no process of another container either: the chart's legacy sidecar sets 30); 0: wait "
                "for one forever"})
    kmsg_path: str = field(default="/dev/kmsg", metadata={
        "help": "the kernel log the oom collector reads for the name and cgroup of each process the OOM killer "
                "kills (readable by root, or with CAP_SYSLOG; a container sees it only where it is mounted); "
                "unreadable or empty: OOM victims are named by their cgroup's counters alone"})
    peak_flops: str = field(default="", metadata={
        "help": "the peak FLOP/s of one device, for the model FLOPs utilisation: one figure (989e12), or one per "
                "dtype (bf16=989e12,fp32=67e12; fp64, fp32, tf32, bf16, fp16, fp8); replaces the GPU table and the "
                "CPU's measured peak (docs/efficiency.md); empty: those"})
    cpu_peak_gflops: float = field(default=0.0, metadata={
        "help": "the CPU's peak in GFLOP/s for the MFU of ranks on the CPU; 0: the figure `outrider run` measured "
                "on this machine (cached per machine and torch), if any"})
    cpu_peak_threads: int = field(default=0, metadata={
        "help": "the threads cpu_peak_gflops was reached with: a rank whose torch uses fewer gets its share; 0: "
                "unknown (every rank gets all of it)"})
    cpu_peak_measure: bool = field(default=True, metadata={
        "help": "`outrider run` measures the CPU's peak (one float32 matrix product in torch, in a child process, "
                "before the command starts: a few seconds, once per machine and torch, then cached) where torch is "
                "installed and no figure is configured or cached"})
    host_root: str = field(default="", metadata={
        "help": "where the host's root filesystem is mounted in a node agent's container (e.g. /host/root): "
                "`filesystems` are then host paths, read through it, labelled and judged read-only as the host "
                "mounts them; empty: the agent's own root"})

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)


FIELDS: dict[str, dataclasses.Field[Any]] = {f.name: f for f in dataclasses.fields(Config)}


def parse_listen(text: str) -> tuple[str, int]:
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([^:\[\]]*):(\d{1,5})", text.strip())
    if not m:
        raise ValueError("host:port, e.g. 127.0.0.1:9477 or [::1]:9477")
    host = m.group(1) if m.group(1) is not None else m.group(3)
    port = int(m.group(2) if m.group(2) is not None else m.group(4))
    if port > 65535:
        raise ValueError("a port from 0 to 65535")
    return host or "0.0.0.0", port


# --- value conversion: each takes a raw value (str from the environment, anything from YAML) -----------------

# Inclusive bounds of every number: a value outside is refused at load with what was expected, rather than an
# interval of 1e308 s that kills a thread or one of 1e-300 s that spins a core. The hook's keys share its bounds.
BOUNDS: dict[str, hook_settings.Bounds] = {
    "interval_s": hook_settings.Bounds(0.05, 3600.0),
    "process_top_n": hook_settings.Bounds(0, 10_000),
    "otlp_interval_s": hook_settings.Bounds(0.1, 86400.0),
    "otlp_timeout_s": hook_settings.Bounds(0.1, 600.0),
    "shutdown_timeout_s": hook_settings.Bounds(0.1, 600.0),
    "collector_timeout_s": hook_settings.Bounds(0.1, 600.0),
    "workload_metrics_port": hook_settings.Bounds(0, 65535),
    "diagnosis_window_s": hook_settings.Bounds(0.1, 86400.0),
    "rule_interval_s": hook_settings.Bounds(0.1, 86400.0),
    # the Prometheus major versions whose PromQL the evaluator follows (rules/promql.COMPATS)
    "promql_compat": hook_settings.Bounds(2, 3),
    "resend_interval_s": hook_settings.Bounds(0.1, 86400.0),
    "k8s_pod_resources_timeout_s": hook_settings.Bounds(0.05, 60.0),
    "pod_discovery_interval_s": hook_settings.Bounds(1.0, 3600.0),
    "startup_grace_s": hook_settings.Bounds(0.0, 2_592_000.0),
    "cpu_peak_gflops": hook_settings.Bounds(0.0, 1e9),
    "cpu_peak_threads": hook_settings.Bounds(0, 1_000_000),
    **hook_settings.BOUNDS,
}


def _number(key: str, integer: bool = False) -> Callable[[Any], float]:
    b = BOUNDS[key]

    def convert(raw: Any) -> Any:
        value = hook_settings.parse_number(b, raw, integer)
        return int(value) if integer else value
    return convert


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def _str(raw: Any) -> str:
    if isinstance(raw, (dict, list, tuple)) or raw is None:
        raise ValueError("a string")
    return str(raw)


def _str_list(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        items = [s.strip() for s in raw.split(",")]
    elif isinstance(raw, (list, tuple)):
        items = [_str(s).strip() for s in raw]
    else:
        raise ValueError("a list of strings (a comma-separated string in the environment)")
    return tuple(s for s in items if s)


def _pid_list(raw: Any) -> tuple[int, ...]:
    items = _str_list(raw) if not isinstance(raw, int) else (str(raw),)
    pids = []
    for item in items:
        if not item.isdigit() or int(item) <= 0:
            raise ValueError("a list of process ids (positive integers)")
        pids.append(int(item))
    return tuple(pids)


def _regex(raw: Any) -> str:
    """A pattern the collectors compile through outrider.ground.regex (linear time, RE2's syntax: Prometheus's)."""
    text = _str(raw)
    try:
        regex.compile(text)
    except regex.RegexError as e:
        raise ValueError(f"a valid regular expression ({e})") from None
    return text


def _label_name(raw: Any) -> str:
    text = _str(raw).strip()
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", text) or text.startswith("__"):
        raise ValueError("a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)")
    return text


def _listen(raw: Any) -> str:
    text = _str(raw)
    parse_listen(text)
    return text


def _http_path(raw: Any) -> str:
    """The path part of a URL: from /, printable ASCII without spaces (nothing that could end a request line)."""
    text = _str(raw).strip()
    if not text.startswith("/") or not all("!" <= c <= "~" for c in text):
        raise ValueError("a URL path starting with / (printable ASCII, no spaces)")
    return text


def _http_url(raw: Any) -> str:
    """An http:// or https:// URL with a host (the API server's: no query, no fragment)."""
    import urllib.parse

    text = _str(raw).strip()
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError("an http(s) URL with a host, e.g. https://10.96.0.1:443")
    try:
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError:
        raise ValueError("an http(s) URL with a numeric port") from None
    return text


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(raw: Any) -> str:
        text = _str(raw).strip().lower()
        if text not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return text
    return convert


K8S_ENV = {"pod": "POD_NAME", "namespace": "POD_NAMESPACE", "node": "NODE_NAME", "container": "CONTAINER_NAME"}


def _peaks(raw: Any) -> str:
    text = _str(raw).strip()
    peaks.parse_peaks(text)  # refused here, with what was expected, rather than by the collector
    return text


def _k8s_labels(raw: Any) -> tuple[str, ...]:
    names = _str_list(raw)
    for name in names:
        if name not in K8S_ENV:
            raise ValueError("label names from: " + ", ".join(K8S_ENV))
    return names


def k8s_identity(config: Config, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed Kubernetes identity labels that the Downward API variables give (empty where unset)."""
    env = os.environ if env is None else env
    return {name: env.get(K8S_ENV[name], "") for name in config.k8s_labels}


def _collectors(raw: Any) -> tuple[str, ...]:
    """Collector names; whether each exists is checked against the registry where a command loads its
    configuration (outrider.collectors.resolve, called by commands/cli.py), so this ground floor never imports a
    collector."""
    names = _str_list(raw)
    for name in names:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ValueError("collector names (lower-case words)")
    return names


CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "interval_s": _number("interval_s"),
    "listen": _listen,
    "collectors": _collectors,
    "proc_root": _str,
    "sys_root": _str,
    "filesystems": _str_list,
    "disk_exclude": _regex,
    "network_exclude": _regex,
    "process_top_n": _number("process_top_n", integer=True),
    "process_command_arguments": _bool,
    "process_full_command": _bool,
    "pids": _pid_list,
    "otlp_endpoint": _str,
    "otlp_protocol": _choice(OTLP_PROTOCOLS),
    "otlp_interval_s": _number("otlp_interval_s"),
    "otlp_timeout_s": _number("otlp_timeout_s"),
    "otlp_histogram_aggregation": _choice(OTLP_HISTOGRAM_AGGREGATIONS),
    "shutdown_timeout_s": _number("shutdown_timeout_s"),
    "log_level": _choice(LOG_LEVELS),
    "spool_dir": _str,
    "flush_interval_s": _number("flush_interval_s"),
    "hook_max_series_per_metric": _number("hook_max_series_per_metric", integer=True),
    "stall_factor": _number("stall_factor"),
    "stall_floor_s": _number("stall_floor_s"),
    "standalone": _bool,
    "nvml_library": _str,
    "tls_cert_file": _str,
    "diagnosis_window_s": _number("diagnosis_window_s"),
    "collector_timeout_s": _number("collector_timeout_s"),
    "runs_dir": _str,
    "tls_key_file": _str,
    "basic_auth_username": _str,
    "basic_auth_username_file": _str,
    "basic_auth_password_file": _str,
    "native_histograms": _bool,
    "k8s_labels": _k8s_labels,
    "rule_files": _str_list,
    "rule_settings": _str_list,
    "rule_interval_s": _number("rule_interval_s"),
    "promql_compat": _number("promql_compat", integer=True),
    "docs_url": lambda raw: links.docs_url(_str(raw)),
    "alert_job": _str,
    "alert_instance": _str,
    "state_dir": _str,
    "receivers_file": _str,
    "alertmanager_urls": _str_list,
    "resend_interval_s": _number("resend_interval_s"),
    "alert_log": _bool,
    "first_step_timeout_s": _number("first_step_timeout_s"),
    "phase_timeout_s": _number("phase_timeout_s"),
    "profile_hz": _number("profile_hz"),
    "flops_every_s": _number("flops_every_s"),
    "training_job": _str,
    "role": _choice(hook_settings.ROLES),
    "spool_trusted_uids": hook_settings.parse_uids,
    "k8s_pod_resources_socket": _str,
    "k8s_pod_resources_timeout_s": _number("k8s_pod_resources_timeout_s"),
    "k8s_owner_namespace_label": _label_name,
    "k8s_owner_pod_label": _label_name,
    "k8s_owner_container_label": _label_name,
    "exit_when_workload_exits": _bool,
    "startup_grace_s": _number("startup_grace_s"),
    "prometheus_multiproc_dir": _str,
    "workload_metrics_port": _number("workload_metrics_port", integer=True),
    "workload_metrics_path": lambda raw: _http_path(raw) if _str(raw).strip() else "/metrics",
    "pod_annotations_file": _str,
    "otlp_receiver_listen": lambda raw: _listen(raw) if _str(raw) else "",
    "scrape_annotated_pods": _bool,
    "pod_discovery_interval_s": _number("pod_discovery_interval_s"),
    "k8s_node_name": lambda raw: _str(raw).strip(),
    "k8s_api_server": lambda raw: _http_url(raw) if _str(raw).strip() else "",
    "k8s_service_account_dir": _str,
    "kmsg_path": _str,
    "host_root": _str,
    "peak_flops": _peaks,
    "cpu_peak_gflops": _number("cpu_peak_gflops"),
    "cpu_peak_threads": _number("cpu_peak_threads", integer=True),
    "cpu_peak_measure": _bool,
}
assert set(CONVERTERS) == set(FIELDS), "every config field needs a converter"


@dataclass(frozen=True)
class LoadedConfig:
    config: Config
    sources: Mapping[str, str]  # key -> where its value came from


def _set(values: dict[str, Any], sources: dict[str, str], key: str, raw: Any, source: str) -> None:
    if key not in FIELDS:
        hint = difflib.get_close_matches(key, list(FIELDS), n=1)
        suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise ConfigError(f"{source}: unknown key '{key}'{suggestion}; known keys: {', '.join(FIELDS)}")
    try:
        values[key] = CONVERTERS[key](raw)
    except ValueError as e:
        raise ConfigError(f"{source}: key '{key}': expected {e}, got {raw!r}") from None
    sources[key] = source


def _otel_defaults(env: Mapping[str, str], values: dict[str, Any], sources: dict[str, str]) -> None:
    """The standard OpenTelemetry variables (and prometheus_client's multiprocess directory, and the Downward API's
    NODE_NAME) set defaults; Outrider's own settings override them."""
    multiproc = env.get("PROMETHEUS_MULTIPROC_DIR")
    if multiproc:
        _set(values, sources, "prometheus_multiproc_dir", multiproc, "environment PROMETHEUS_MULTIPROC_DIR")
    node = env.get(K8S_ENV["node"])
    if node:
        _set(values, sources, "k8s_node_name", node, f"environment {K8S_ENV['node']}")
    proto = env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if proto:
        name = ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL" if env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                else "OTEL_EXPORTER_OTLP_PROTOCOL")
        _set(values, sources, "otlp_protocol", proto, f"environment {name}")
    aggregation = env.get("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION")
    if aggregation:
        _set(values, sources, "otlp_histogram_aggregation", aggregation,
             "environment OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION")
    interval_ms = env.get("OTEL_METRIC_EXPORT_INTERVAL")
    if interval_ms:
        try:
            seconds = float(interval_ms) / 1000.0
        except ValueError:
            raise ConfigError(
                f"environment OTEL_METRIC_EXPORT_INTERVAL: expected milliseconds, got {interval_ms!r}") from None
        _set(values, sources, "otlp_interval_s", seconds, "environment OTEL_METRIC_EXPORT_INTERVAL")


MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_yaml_file(path: str, max_bytes: int | None = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A YAML mapping from a file; every way the file can be wrong is a ConfigError naming it, never a traceback
    (and never a hang: a FIFO or a device is refused before it is opened for reading). max_bytes None: any size
    (a promtool test file, which promtool reads whatever its length)."""
    import stat

    import yaml

    source = f"file {path}"
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{source}: not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ConfigError(f"{source}: {st.st_size} bytes, more than a configuration needs "
                              f"({max_bytes} at most)")
        with open(path, "rb") as fh:
            raw = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
        if max_bytes is not None and len(raw) > max_bytes:
            # a file whose size stat does not tell (/proc, /sys) or that grew since: refused, not parsed cut short
            raise ConfigError(f"{source}: more than {max_bytes} bytes, more than a configuration needs")
        data = yaml.safe_load(raw.decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{source}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{source}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys to values at the top level, "
                          f"got {type(data).__name__}")
    return data


def load(
    file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Build the configuration: defaults < file < OUTRIDER_* environment < flags. Collector names are checked
    against the registry, and --collector.NAME toggles applied, by outrider.collectors.resolve."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {name: "default" for name in FIELDS}
    _otel_defaults(env, values, sources)

    file = file or env.get(ENV_PREFIX + "CONFIG") or None
    if file:
        for key, raw in read_yaml_file(file).items():
            _set(values, sources, str(key), raw, f"file {file}")

    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in (ENV_PREFIX + "CONFIG", ENV_PREFIX + "DISABLED"):
            continue
        key = name[len(ENV_PREFIX):].lower()
        _set(values, sources, key, raw, f"environment {name}")

    for key, raw in (flags or {}).items():
        if raw is None:
            continue
        flag = (flag_names or {}).get(key) or "--" + key.replace("_", "-")
        _set(values, sources, key, raw, f"flag {flag}")

    return LoadedConfig(Config(**values), sources)


# The hook settings the agent's configuration holds and hands to the processes it starts (`outrider run`); the
# hook's `listen` is the address of an agent it would start itself, not this agent's, and the spool is the run's own.
HANDED_TO_HOOK = tuple(k for k in hook_settings.KEYS if k in FIELDS and k not in ("listen", "spool_dir"))


def hook_environment(config: Config, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The OUTRIDER_* variables that give a hooked child this configuration's hook settings: each one the
    configuration sets away from the hook's default, and each one the environment already names (its value then
    the configuration's, which the environment fed)."""
    env = os.environ if env is None else env
    values = {k: getattr(config, k) for k in HANDED_TO_HOOK
              if getattr(config, k) != hook_settings.KEYS[k] or ENV_PREFIX + k.upper() in env}
    return hook_settings.environment(values)


def default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "outrider")


def otlp_enabled(config: Config, env: Mapping[str, str] | None = None) -> bool:
    """OTLP export is on when an endpoint is configured here or in the standard OTEL_* variables, unless
    OTEL_METRICS_EXPORTER=none."""
    env = os.environ if env is None else env
    if env.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(config.otlp_endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def redact_url_password(url: str) -> str:
    """`https://user:<secret>@host/`: the password of a URL's userinfo hidden, for showing the URL."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, _ = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:<secret>@{rest[len(userinfo) + 1:]}"


def to_yaml(loaded: LoadedConfig) -> str:
    """The effective configuration as YAML, each key with its source as a comment (for `config show`)."""
    import yaml

    lines = []
    for name in FIELDS:
        value = getattr(loaded.config, name)
        # a password in any URL (alertmanager_urls, otlp_endpoint, docs_url...) is hidden, whichever key holds it
        if isinstance(value, str):
            value = redact_url_password(value)
        if isinstance(value, tuple):
            value = [redact_url_password(v) if isinstance(v, str) else v for v in value]
        text = yaml.safe_dump({name: value}, default_flow_style=True, width=1000).strip()
        if "\n" in text:  # a value with a line break: one line still, escaped, so the source comment stays beside it
            text = yaml.safe_dump({name: value}, default_flow_style=True, width=1000, default_style='"').strip()
            text = text.replace(f'"{name}": ', f"{name}: ", 1)
        if text.startswith("{") and text.endswith("}"):
            text = text[1:-1]
        lines.append(f"{text}  # {loaded.sources[name]}")
    return "\n".join(lines) + "\n"

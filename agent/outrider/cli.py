"""The `outrider` command: agent, run, metrics, config, demo."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from outrider import __version__
from outrider.config import ConfigError, LoadedConfig, load, to_yaml
from outrider.logs import setup_logging

LOG = logging.getLogger("outrider.cli")

# Flags that set config keys: flag -> (config key, help). `action` "append" for repeatable ones.
CONFIG_FLAGS: dict[str, tuple[str, str]] = {
    "--interval": ("interval_s", "seconds between sweeps"),
    "--listen": ("listen", "host:port for /metrics (default 127.0.0.1:9477; 0.0.0.0:PORT for all interfaces)"),
    "--proc-root": ("proc_root", "procfs mount (default /proc)"),
    "--sys-root": ("sys_root", "sysfs mount (default /sys)"),
    "--process-top-n": ("process_top_n", "processes reported one by one, the rest summed as pid=\"other\""),
    "--otlp-endpoint": ("otlp_endpoint", "OTLP base URL, e.g. http://collector:4318"),
    "--otlp-protocol": ("otlp_protocol", "http/protobuf or grpc"),
    "--otlp-interval": ("otlp_interval_s", "seconds between OTLP exports"),
    "--log-level": ("log_level", "debug, info, warning, error"),
}
REPEATED_FLAGS: dict[str, tuple[str, str]] = {
    "--filesystem": ("filesystems", "a path whose filesystem space is reported (repeatable; replaces the default /)"),
}


class _CollectorToggle(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        toggles = list(getattr(namespace, "collector_toggles", None) or [])
        toggles.append(self.const)
        namespace.collector_toggles = toggles


def _add_config_flags(p: argparse.ArgumentParser, with_pid: bool = False) -> None:
    from outrider.collectors import REGISTRY

    p.add_argument("--config", metavar="FILE", help="YAML config file (also OUTRIDER_CONFIG)")
    for flag, (key, text) in CONFIG_FLAGS.items():
        p.add_argument(flag, dest=key, metavar=key.split("_")[0].upper(), help=text)
    for flag, (key, text) in REPEATED_FLAGS.items():
        p.add_argument(flag, dest=key, action="append", metavar="PATH", help=text)
    if with_pid:
        p.add_argument("--pid", dest="pids", action="append", metavar="PID",
                       help="watch this process and its descendants (repeatable); default: all processes")
    group = p.add_argument_group("collectors")
    for name, cls in REGISTRY.items():
        group.add_argument(f"--collector.{name}", nargs=0, action=_CollectorToggle, const=(name, True),
                           help=f"enable the {name} collector: {cls.description}")
        group.add_argument(f"--no-collector.{name}", nargs=0, action=_CollectorToggle, const=(name, False),
                           help=f"disable the {name} collector")


def _load(args: argparse.Namespace) -> LoadedConfig:
    keys = [k for k, _ in CONFIG_FLAGS.values()] + [k for k, _ in REPEATED_FLAGS.values()] + ["pids"]
    flags = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    names = {k: f for f, (k, _) in {**CONFIG_FLAGS, **REPEATED_FLAGS}.items()}
    names["pids"] = "--pid"
    return load(file=args.config, flags=flags, collector_toggles=getattr(args, "collector_toggles", None),
                flag_names=names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outrider", description=__doc__)
    parser.add_argument("--version", action="version", version=f"outrider {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("agent", help="run the agent: sweep, serve /metrics, export OTLP, until SIGTERM")
    _add_config_flags(p, with_pid=True)

    p = sub.add_parser("run", help="run a command under watch: outrider run [options] -- CMD ...")
    _add_config_flags(p)
    p.add_argument("--summary-json", metavar="FILE", help="also write the end-of-run summary as JSON")
    p.add_argument("--quiet", action="store_true", help="print no banner and no summary")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")

    p = sub.add_parser("metrics", help="one sweep printed as exposition text")
    _add_config_flags(p, with_pid=True)
    p.add_argument("--once", action="store_true", help="one sweep, then exit (the only mode for now)")
    p.add_argument("--openmetrics", action="store_true", help="OpenMetrics instead of Prometheus text")

    p = sub.add_parser("config", help="check a config file, or show the effective configuration")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    c = csub.add_parser("check", help="validate a YAML config file")
    c.add_argument("file")
    c = csub.add_parser("show", help="the effective configuration, each value with its source")
    _add_config_flags(c, with_pid=True)

    p = sub.add_parser("rules", help="the alert rules: export them as a rule file, a PrometheusRule or for Grafana")
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION")
    r = rsub.add_parser("export", help="print the rules in a format, with thresholds tuned by --set")
    r.add_argument("--format", default="prometheus", choices=("prometheus", "prometheusrule", "grafana"))
    r.add_argument("--set", dest="settings", action="append", default=[], metavar="RULE.NAME=VALUE",
                   help="tune a threshold, or RULE.for / RULE.severity (see alerts/tunables.yaml); repeatable")
    r.add_argument("--rules", metavar="FILE", help="rule file (default: alerts/outrider.rules.yaml)")
    r.add_argument("--datasource-uid", default="prometheus", help="Grafana's Prometheus datasource UID")
    r.add_argument("--namespace", help="namespace of the PrometheusRule")
    r = rsub.add_parser("check", help="load rule files as the agent's embedded evaluator does (default: the catalog)")
    r.add_argument("files", nargs="*", metavar="FILE")
    r = rsub.add_parser("test", help="replay promtool rule unit-test files through the embedded evaluator")
    r.add_argument("files", nargs="+", metavar="FILE")

    p = sub.add_parser("dashboards", help="the Grafana dashboards: export them to files or push them to Grafana")
    dsub = p.add_subparsers(dest="dashboards_command", metavar="ACTION")
    d = dsub.add_parser("export", help="write the dashboards' JSON and a Grafana file-provisioning provider")
    d.add_argument("dir")
    d.add_argument("--provider-path", help="the path Grafana will read them from (default: DIR)")
    d = dsub.add_parser("push", help="create the Outrider folder and upsert the dashboards through Grafana's API")
    d.add_argument("--url", required=True, help="Grafana's URL, e.g. https://grafana.example.com")
    d.add_argument("--token-file", help="file holding a service account token (default: $GRAFANA_TOKEN)")
    d.add_argument("--datasource-uid", help="Prometheus datasource to select by default (checked to exist)")

    p = sub.add_parser("top", help="a live terminal view of an agent: GPUs, KPIs, the verdict, stalls")
    p.add_argument("--url", default="http://127.0.0.1:9477", help="the agent (default http://127.0.0.1:9477)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between screens")
    p.add_argument("--once", action="store_true", help="draw one screen and exit")

    p = sub.add_parser("alerts", help="the pending and firing alerts of a running agent's own rule evaluation")
    p.add_argument("--url", default="http://127.0.0.1:9477", help="the agent's base URL")
    p = sub.add_parser("runs", help="list the runs `outrider run` recorded")
    p.add_argument("--runs-dir", help="where the records are (default: the runs_dir setting)")
    p = sub.add_parser("report", help="write the HTML report of a recorded run")
    p.add_argument("run", help="a run id, a unique prefix of one, or 'last'")
    p.add_argument("-o", "--output", help="file to write (default: outrider-report-RUN.html)")
    p.add_argument("--runs-dir", help="where the records are")
    p = sub.add_parser("compare", help="compare two recorded runs: KPI deltas with confidence intervals")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--runs-dir", help="where the records are")

    p = sub.add_parser("demo", help="run a bundled synthetic workload under watch and show what Outrider sees")
    p.add_argument("--duration", type=float, default=12.0, help="seconds the workload runs (default 12)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _dispatch(parser, args)
    except ConfigError as e:
        print(f"outrider: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "config":
        if args.config_command == "check":
            from outrider.alerting import receivers, rule_groups

            loaded = load(file=args.file, env={})
            groups = rule_groups(loaded.config)  # the rule files and receivers it names load too
            routes = receivers(loaded.config)
            print(f"{args.file}: ok ({sum(s != 'default' for s in loaded.sources.values())} keys set; "
                  f"{sum(len(g.rules) for g in groups)} rules, receivers: "
                  f"{', '.join(n.name for n, _ in routes) or 'none'})")
            return 0
        if args.config_command == "show":
            sys.stdout.write(to_yaml(_load(args)))
            return 0
        parser.parse_args(["config", "--help"])
        return 2
    if args.command == "rules":
        from pathlib import Path

        from outrider.rules.export import RulesError, default_rules_path, export

        if args.rules_command == "check":
            from outrider.rules.rule import RuleLoadError, load_groups

            try:
                for path in args.files or [str(default_rules_path())]:
                    groups = load_groups([path])
                    print(f"{path}: ok ({sum(len(g.rules) for g in groups)} rules the agent can evaluate)")
            except RuleLoadError as e:
                print(f"outrider rules check: {e}", file=sys.stderr)
                return 1
            return 0
        if args.rules_command == "test":
            from outrider.rules.promtest import main as replay

            return replay(args.files)
        if args.rules_command != "export":
            parser.parse_args(["rules", "--help"])
            return 2
        try:
            sys.stdout.write(export(args.format, args.settings, Path(args.rules) if args.rules else None,
                                    args.datasource_uid, args.namespace))
        except RulesError as e:
            print(f"outrider rules export: {e}", file=sys.stderr)
            return 2
        return 0
    if args.command == "dashboards":
        from pathlib import Path

        try:
            from outrider.dashboards import provision
        except ImportError as e:
            print(f"outrider dashboards: needs the grafana extra: pip install 'outrider[grafana]' ({e})",
                  file=sys.stderr)
            return 2
        if args.dashboards_command == "export":
            for path in provision.export(Path(args.dir), args.provider_path):
                print(path)
            return 0
        if args.dashboards_command == "push":
            try:
                for url in provision.push(args.url, provision.read_token(args.token_file), args.datasource_uid):
                    print(url)
            except provision.PushError as e:
                print(f"outrider dashboards push: {e}", file=sys.stderr)
                return 1
            return 0
        parser.parse_args(["dashboards", "--help"])
        return 2
    if args.command == "alerts":
        return _alerts_command(args.url)
    if args.command == "top":
        from outrider.top import run_top

        return run_top(args.url, args.interval, args.once)
    if args.command in ("runs", "report", "compare"):
        return _runs_command(args)
    if args.command == "demo":
        from outrider.demo import run_demo

        setup_logging("warning")
        return run_demo(args.duration)

    loaded = _load(args)
    cfg = loaded.config
    setup_logging(cfg.log_level)
    if args.command == "metrics":
        from outrider.sampler import Sampler

        sampler = Sampler(cfg)
        sampler.sweep()
        time.sleep(0.2)  # a second sweep, so values computed between sweeps (CPU utilisation) are present
        sampler.sweep()
        sys.stdout.buffer.write(sampler.exposition(openmetrics=args.openmetrics))
        sampler.stop()
        return 0
    if args.command == "agent":
        from outrider.agent import Agent

        try:
            agent = Agent(cfg)
        except OSError as e:  # the listen address is taken or not ours
            print(f"outrider agent: {e.strerror or e}", file=sys.stderr)
            return 1
        return agent.run_until_signal()
    if args.command == "run":
        from outrider.runner import run

        cmd = list(args.cmd)
        if cmd and cmd[0] == "--":
            cmd = cmd[1:]
        if not cmd:
            print("outrider run: no command given: outrider run [options] -- CMD [ARGS...]", file=sys.stderr)
            return 2
        code, _ = run(cmd, cfg, summary_json=args.summary_json, quiet=args.quiet)
        return code
    parser.print_help()
    return 2


def _alerts_command(url: str) -> int:
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api/v1/alerts", timeout=10) as response:
            alerts = json.load(response)["data"]["alerts"]
    except (OSError, ValueError, KeyError) as e:
        reason = getattr(e, "reason", e)
        print(f"outrider alerts: cannot read {url}/api/v1/alerts: {reason}", file=sys.stderr)
        return 1
    if not alerts:
        print("no pending or firing alerts")
    for a in sorted(alerts, key=lambda a: (a["state"] != "firing", a["labels"].get("alertname", ""))):
        labels = ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()) if k != "alertname")
        print(f"{a['state'].upper():8} {a['labels'].get('alertname', ''):32} since {a['activeAt'][:19]}  {{{labels}}}")
        if a["annotations"].get("summary"):
            print(f"{'':9}{a['annotations']['summary']}")
    return 0


def _runs_command(args: argparse.Namespace) -> int:
    from outrider.runs.store import RunNotFound, RunStore

    runs_dir = args.runs_dir or load().config.runs_dir or None
    store = RunStore(runs_dir)
    try:
        if args.command == "runs":
            for run_id, started, ended, code, command in store.list_runs():
                length = f"{ended - started:7.0f} s" if ended else "  running"
                print(f"{run_id}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}  {length}  "
                      f"exit {code if code is not None else '-':>3}  {' '.join(command)[:80]}")
            return 0
        if args.command == "report":
            from outrider.runs.report import render

            rec = store.load(args.run)
            out = args.output or f"outrider-report-{rec.id}.html"
            with open(out, "w", encoding="utf-8") as fh:
                fh.write(render(rec))
            print(out)
            return 0
        from outrider.runs.compare import compare

        a, b = store.load(args.run_a), store.load(args.run_b)
        results = compare(a, b)
        print(f"A = {a.id} ({' '.join(a.command)[:60]})\nB = {b.id} ({' '.join(b.command)[:60]})")
        if not results:
            print("no KPI with enough samples in both runs (at least 5 sweeps after warm-up)")
        for r in results:
            print("  " + r.sentence())
        return 0
    except RunNotFound as e:
        print(f"outrider {args.command}: {e}", file=sys.stderr)
        return 2
    finally:
        store.close()


if __name__ == "__main__":
    raise SystemExit(main())

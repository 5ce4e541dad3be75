"""The `outrider` command: one function per subcommand, each registered with its parser (`set_defaults`)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from outrider.ground.config import ConfigError, LoadedConfig, load, to_yaml
from outrider.ground.logs import setup_logging
from outrider.shared.version import __version__

LOG = logging.getLogger("outrider.cli")

Command = Callable[[argparse.Namespace], int]

# Flags that set config keys: flag -> (config key, help).
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
    """defaults < file < environment < flags, then the collector names checked and the toggles applied."""
    from outrider import collectors

    keys = [k for k, _ in CONFIG_FLAGS.values()] + [k for k, _ in REPEATED_FLAGS.values()] + ["pids"]
    flags = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    names = {k: f for f, (k, _) in {**CONFIG_FLAGS, **REPEATED_FLAGS}.items()}
    names["pids"] = "--pid"
    loaded = load(file=args.config, flags=flags, flag_names=names)
    return collectors.resolve(loaded, getattr(args, "collector_toggles", None) or ())


# --- the agent -------------------------------------------------------------------------------------------------

def cmd_agent(args: argparse.Namespace) -> int:
    from outrider.wiring.agent import Agent

    cfg = _load(args).config
    setup_logging(cfg.log_level)
    try:
        agent = Agent(cfg)
    except OSError as e:  # the listen address is taken or not ours
        print(f"outrider agent: {e.strerror or e}", file=sys.stderr)
        return 1
    return agent.run_until_signal()


def cmd_standalone(args: argparse.Namespace) -> int:
    from outrider.commands.standalone import run

    return run(args.workload_pid, args.spool_dir, args.listen, args.detach)


def cmd_run(args: argparse.Namespace) -> int:
    from outrider.commands.runner import run

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd or not cmd[0]:
        print("outrider run: no command given: outrider run [options] -- CMD [ARGS...]", file=sys.stderr)
        return 2
    loaded = _load(args)
    cfg = loaded.config
    # --quiet: nothing on stderr but what needs acting on (warnings, errors), unless a log level was asked for
    asked = loaded.sources.get("log_level", "default") != "default"
    setup_logging("warning" if args.quiet and not asked else cfg.log_level)
    # A second run (or a sidecar) may hold the default port: it falls back, but a port asked for is this run's or none
    code, _ = run(cmd, cfg, summary_json=args.summary_json, quiet=args.quiet,
                  listen_fallback=loaded.sources["listen"] == "default")
    return code


def cmd_metrics(args: argparse.Namespace) -> int:
    from outrider.wiring.sampler import Sampler

    cfg = _load(args).config
    setup_logging(cfg.log_level)
    sampler = Sampler(cfg)
    sampler.sweep()
    time.sleep(0.2)  # a second sweep, so values computed between sweeps (CPU utilisation) are present
    sampler.sweep()
    sys.stdout.buffer.write(sampler.exposition("openmetrics" if args.openmetrics else "text"))
    sampler.stop()
    return 0


# --- configuration ---------------------------------------------------------------------------------------------

def cmd_config_check(args: argparse.Namespace) -> int:
    from outrider import collectors
    from outrider.wiring.alerting import receivers, rule_groups

    loaded = collectors.resolve(load(file=args.file, env={}))
    groups = rule_groups(loaded.config)  # the rule files and receivers it names load too
    routes = receivers(loaded.config)
    print(f"{args.file}: ok ({sum(s != 'default' for s in loaded.sources.values())} keys set; "
          f"{sum(len(g.rules) for g in groups)} rules, receivers: {', '.join(n.name for n, _ in routes) or 'none'})")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    sys.stdout.write(to_yaml(_load(args)))
    return 0


# --- rules -----------------------------------------------------------------------------------------------------

def cmd_rules_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from outrider.rules.export import export
    from outrider.rules.files import RulesError

    try:
        sys.stdout.write(export(args.format, args.settings, Path(args.rules) if args.rules else None,
                                args.datasource_uid, args.namespace))
    except RulesError as e:
        print(f"outrider rules export: {e}", file=sys.stderr)
        return 2
    return 0


def _promql_compat(args: argparse.Namespace, command: str) -> int | None:
    """--promql-compat, else OUTRIDER_PROMQL_COMPAT, else the configuration's default (3); None after saying why a
    value is wrong."""
    import os

    from outrider.ground.config import CONVERTERS, Config

    raw, source = args.promql_compat, "--promql-compat"
    if raw is None:
        raw, source = os.environ.get("OUTRIDER_PROMQL_COMPAT"), "OUTRIDER_PROMQL_COMPAT"
    if raw is None:
        return Config.promql_compat
    try:
        return int(CONVERTERS["promql_compat"](raw))
    except ValueError as e:
        print(f"outrider rules {command}: {source}: {raw!r}: expected {e}", file=sys.stderr)
        return None


def cmd_rules_check(args: argparse.Namespace) -> int:
    from outrider.rules.files import default_rules_path
    from outrider.rules.rule import RuleLoadError, load_groups

    compat = _promql_compat(args, "check")
    if compat is None:
        return 2
    try:
        for path in args.files or [str(default_rules_path())]:
            groups = load_groups([path])
            print(f"{path}: ok ({sum(len(g.rules) for g in groups)} rules the agent can evaluate, as Prometheus "
                  f"{compat} evaluates them: promql_compat {compat})")
            for line in _compat_report(groups, compat):
                print(f"{path}: {line}")
    except RuleLoadError as e:
        print(f"outrider rules check: {e}", file=sys.stderr)
        return 2
    return 0


def _compat_report(groups: list[Any], compat: int) -> list[str]:
    """Where the rules' results can differ between Prometheus 2 and 3: a warning per rule whose le matcher 3 never
    matches, and one line each for the rules reading range windows and the regexes whose `.` meets newlines."""
    from outrider.rules.promql import compat_differences
    from outrider.rules.rule import AlertingRule

    other = 2 if compat == 3 else 3
    ranges, regexes, out = [], [], []
    for g in groups:
        for rule in g.rules:
            found = compat_differences(rule.expr)
            where = f"group {g.name!r}, {'alert' if isinstance(rule, AlertingRule) else 'recording rule'} {rule.name!r}"
            if found.ranges:
                ranges.append(rule.name)
            if found.newline_regexes:
                regexes.append(rule.name)
            for written, stored in found.normalised_le:
                out.append(f"warning: {where}: le=\"{written}\" selects nothing scraped by Prometheus 3, which "
                           f"stores that bucket as le=\"{stored}\" (Prometheus 2 keeps the page's text)")
    if ranges:
        out.append(f"{_rules(len(ranges))} read range windows, which Prometheus 3 leaves open at the start and 2 "
                   "closes: a sample exactly one range old counts under Prometheus 2 only, so results on a sampling "
                   f"grid (promtool's tests, the agent's sweeps) can differ under promql_compat {other}: "
                   + ", ".join(sorted(set(ranges))))
    if regexes:
        out.append(f"{_rules(len(regexes))} match regexes whose `.` matches a newline in Prometheus 3, not in 2 (a "
                   "label value with a newline): " + ", ".join(sorted(set(regexes))))
    return out


def _rules(n: int) -> str:
    return f"{n} rule" if n == 1 else f"{n} rules"


def cmd_rules_test(args: argparse.Namespace) -> int:
    from outrider.rules.promtest import PromTestError
    from outrider.rules.promtest import main as replay
    from outrider.rules.rule import RuleLoadError

    compat = _promql_compat(args, "test")
    if compat is None:
        return 2
    try:
        return replay(args.files, compat)
    except (PromTestError, RuleLoadError) as e:  # a test file, or a rule file it names, that cannot be used
        print(f"outrider rules test: {e}", file=sys.stderr)
        return 2


PROMQL_COMPAT_HELP = ("evaluate as Prometheus 2 or 3 does (default: $OUTRIDER_PROMQL_COMPAT, else 3; "
                      "docs/alerting.md, Prometheus 2 and 3)")


# --- dashboards ------------------------------------------------------------------------------------------------

DOCS_URL_HELP = ("base URL of Outrider's documentation for the runbook links (a mirror or wiki; default: "
                 "$OUTRIDER_DOCS_URL, else the repository)")


def _provision() -> Any:
    try:
        from outrider.dashboards import provision
    except ImportError as e:
        raise SystemExit(f"outrider dashboards: needs the grafana extra: pip install 'outrider[grafana]' ({e})") \
            from None
    return provision


def cmd_dashboards_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    try:
        for path in _provision().export(Path(args.dir), args.provider_path, args.docs_url):
            print(path)
    except ValueError as e:  # a documentation URL that is not one
        print(f"outrider dashboards export: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_dashboards_push(args: argparse.Namespace) -> int:
    provision = _provision()
    try:
        for url in provision.push(args.url, provision.read_token(args.token_file), args.datasource_uid,
                                  docs_url=args.docs_url):
            print(url)
    except (provision.PushError, ValueError) as e:
        print(f"outrider dashboards push: {e}", file=sys.stderr)
        return 1
    return 0


# --- looking at a running agent --------------------------------------------------------------------------------

def cmd_top(args: argparse.Namespace) -> int:
    try:
        from outrider.commands.top import run_top
    except ModuleNotFoundError as e:
        if e.name != "rich" and not (e.name or "").startswith("rich."):
            raise
        print("outrider top draws with rich, which is not installed: pip install 'outrider[top]' (the agent's "
              "image leaves it out: run top where you are, with --url pointing at the agent)", file=sys.stderr)
        return 2
    return run_top(args.url, args.interval, args.once)


def cmd_alerts(args: argparse.Namespace) -> int:
    import json
    import urllib.request

    url = args.url
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


# --- recorded runs ---------------------------------------------------------------------------------------------

def _run_store(args: argparse.Namespace) -> Any:
    from outrider.runs.store import RunStore

    return RunStore(args.runs_dir or load().config.runs_dir or None)


def _with_runs(fn: Callable[[Any, argparse.Namespace], int]) -> Command:
    def command(args: argparse.Namespace) -> int:
        from outrider.runs.store import RunNotFound

        store = _run_store(args)
        try:
            return fn(store, args)
        except RunNotFound as e:
            print(f"outrider {args.command}: {e}", file=sys.stderr)
            return 2
        finally:
            store.close()
    return command


def cmd_runs(store: Any, args: argparse.Namespace) -> int:
    for run_id, started, ended, code, command in store.list_runs():
        length = f"{ended - started:7.0f} s" if ended else "  running"
        print(f"{run_id}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}  {length}  "
              f"exit {code if code is not None else '-':>3}  {' '.join(command)[:80]}")
    return 0


def cmd_report(store: Any, args: argparse.Namespace) -> int:
    from outrider.runs.report import render

    rec = store.load(args.run)
    out = args.output or f"outrider-report-{rec.id}.html"
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(render(rec))
    print(out)
    return 0


def cmd_compare(store: Any, args: argparse.Namespace) -> int:
    from outrider.runs.compare import compare_all

    a, b = store.load(args.run_a), store.load(args.run_b)
    results, skipped = compare_all(a, b)
    print(f"A = {a.id} ({' '.join(a.command)[:60]})\nB = {b.id} ({' '.join(b.command)[:60]})")
    if not results and not skipped:
        print("no KPI recorded in either run")
    else:
        print("B against A: (B's change [95% interval]; what each run's number stands on)")
    for r in results:
        print("  " + r.sentence())
    if skipped:
        print("not compared:")
        for s in skipped:
            print("  " + s.sentence())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from outrider.commands.demo import run_demo

    setup_logging("warning")
    return run_demo(args.duration)


# --- the parser ------------------------------------------------------------------------------------------------

def _group(sub: Any, name: str, help_text: str) -> Any:
    """A subcommand with actions of its own; without one it prints its help and exits 2."""
    p = sub.add_parser(name, help=help_text)
    p.set_defaults(func=lambda args: _usage(p))
    return p.add_subparsers(metavar="ACTION")


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outrider", description=__doc__)
    parser.add_argument("--version", action="version", version=f"outrider {__version__}")
    parser.set_defaults(func=lambda args: _usage(parser))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("agent", help="run the agent: sweep, serve /metrics, export OTLP, until SIGTERM")
    _add_config_flags(p, with_pid=True)
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("standalone", help="the agent an instrumented process starts when no agent serves its "
                                          "spool; exits after the last instrumented process (configured by the "
                                          "OUTRIDER_* environment it shares with the workload)")
    p.add_argument("--workload-pid", type=int, default=0, metavar="PID",
                   help="the starting process: its tree is watched, and the agent outlives it by a grace period")
    p.add_argument("--spool-dir", help="the spool (default: the per-user default spool)")
    p.add_argument("--listen", help="host:port for /metrics (a busy one is an error); by default 127.0.0.1:9477, "
                                    "or a free port while that one is busy")
    p.add_argument("--detach", action="store_true",
                   help="once the spool's lock is held, fork and let the first process exit 0")
    p.set_defaults(func=cmd_standalone)

    p = sub.add_parser("run", help="run a command under watch: outrider run [options] -- CMD ...")
    _add_config_flags(p)
    p.add_argument("--summary-json", metavar="FILE", help="also write the end-of-run summary as JSON")
    p.add_argument("--quiet", action="store_true",
                   help="print no banner, no summary and no log line under a warning (unless --log-level or the "
                        "configuration asks for one)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("metrics", help="one sweep printed as exposition text")
    _add_config_flags(p, with_pid=True)
    p.add_argument("--once", action="store_true", help="one sweep, then exit (what `outrider metrics` always does)")
    p.add_argument("--openmetrics", action="store_true", help="OpenMetrics instead of Prometheus text")
    p.set_defaults(func=cmd_metrics)

    actions = _group(sub, "config", "check a config file, or show the effective configuration")
    c = actions.add_parser("check", help="validate a YAML config file (and the rule files and receivers it names)")
    c.add_argument("file")
    c.set_defaults(func=cmd_config_check)
    c = actions.add_parser("show", help="the effective configuration, each value with its source")
    _add_config_flags(c, with_pid=True)
    c.set_defaults(func=cmd_config_show)

    actions = _group(sub, "rules", "the alert rules: check, test, or export them")
    r = actions.add_parser("export", help="print the rules in a format, with thresholds tuned by --set")
    r.add_argument("--format", default="prometheus", choices=("prometheus", "prometheusrule", "grafana"))
    r.add_argument("--set", dest="settings", action="append", default=[], metavar="RULE.NAME=VALUE",
                   help="tune a threshold, or RULE.for / RULE.severity (see alerts/tunables.yaml); repeatable")
    r.add_argument("--rules", metavar="FILE", help="rule file (default: alerts/outrider.rules.yaml)")
    r.add_argument("--datasource-uid", default="prometheus", help="Grafana's Prometheus datasource UID")
    r.add_argument("--namespace", help="namespace of the PrometheusRule")
    r.set_defaults(func=cmd_rules_export)
    r = actions.add_parser("check", help="load rule files as the agent's embedded evaluator does (default: the "
                                         "catalog)")
    r.add_argument("files", nargs="*", metavar="FILE")
    r.add_argument("--promql-compat", choices=("2", "3"), help=PROMQL_COMPAT_HELP)
    r.set_defaults(func=cmd_rules_check)
    r = actions.add_parser("test", help="replay promtool rule unit-test files through the embedded evaluator")
    r.add_argument("files", nargs="+", metavar="FILE")
    r.add_argument("--promql-compat", choices=("2", "3"), help=PROMQL_COMPAT_HELP)
    r.set_defaults(func=cmd_rules_test)

    actions = _group(sub, "dashboards", "the Grafana dashboards: export them to files or push them to Grafana")
    d = actions.add_parser("export", help="write the dashboards' JSON and a Grafana file-provisioning provider")
    d.add_argument("dir")
    d.add_argument("--provider-path", help="the path Grafana will read them from (default: DIR)")
    d.add_argument("--docs-url", help=DOCS_URL_HELP)
    d.set_defaults(func=cmd_dashboards_export)
    d = actions.add_parser("push", help="create the Outrider folder and upsert the dashboards through Grafana's API")
    d.add_argument("--url", required=True, help="Grafana's URL, e.g. https://grafana.example.com")
    d.add_argument("--token-file", help="file holding a service account token (default: $GRAFANA_TOKEN)")
    d.add_argument("--datasource-uid", help="Prometheus datasource to select by default (checked to exist)")
    d.add_argument("--docs-url", help=DOCS_URL_HELP)
    d.set_defaults(func=cmd_dashboards_push)

    p = sub.add_parser("top", help="a live terminal view of an agent: GPUs, KPIs, the verdict, stalls")
    p.add_argument("--url", default="http://127.0.0.1:9477", help="the agent (default http://127.0.0.1:9477)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between screens")
    p.add_argument("--once", action="store_true",
                   help="read until the agent has swept again (rates need two sweeps), draw one screen and exit")
    p.set_defaults(func=cmd_top)

    p = sub.add_parser("alerts", help="the pending and firing alerts of a running agent's own rule evaluation")
    p.add_argument("--url", default="http://127.0.0.1:9477", help="the agent's base URL")
    p.set_defaults(func=cmd_alerts)

    p = sub.add_parser("runs", help="list the runs `outrider run` recorded")
    p.add_argument("--runs-dir", help="where the records are (default: the runs_dir setting)")
    p.set_defaults(func=_with_runs(cmd_runs))
    p = sub.add_parser("report", help="write the HTML report of a recorded run")
    p.add_argument("run", help="a run id, a unique prefix of one, or 'last'")
    p.add_argument("-o", "--output", help="file to write (default: outrider-report-RUN.html)")
    p.add_argument("--runs-dir", help="where the records are")
    p.set_defaults(func=_with_runs(cmd_report))
    p = sub.add_parser("compare", help="compare two recorded runs step by step and request by request: which is "
                                       "better and by how much, with 95%% intervals")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--runs-dir", help="where the records are")
    p.set_defaults(func=_with_runs(cmd_compare))

    p = sub.add_parser("demo", help="run a bundled synthetic workload under watch and show what Outrider sees")
    p.add_argument("--duration", type=float, default=12.0, help="seconds the workload runs (default 12)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"outrider: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

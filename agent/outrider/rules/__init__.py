"""Alert rules and their embedded evaluator: rule files and tunables (files.py; the one source is
alerts/outrider.rules.yaml), the PromQL subset (promql.py) over a bounded sample store (store.py), rules and alert
state (rule.py), annotation templates (templates.py), the agent's evaluation loop (engine.py) and what it hands to
the notifiers (notification.py), promtool test replay (promtest.py), and conversion to PrometheusRule and Grafana
alert provisioning (export.py)."""

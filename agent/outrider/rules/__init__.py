"""Alert rules: the rule file (alerts/outrider.rules.yaml), its tunables, and conversion to PrometheusRule and
Grafana alert provisioning (export.py). The embedded evaluator comes here too."""

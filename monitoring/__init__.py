"""gpt2bench monitoring as code: one Python source for the Prometheus rules, the alerts and the Grafana
dashboards (`python -m monitoring.generate --write|--check`).

`config.py` holds the selectors and thresholds, `rules.py` the recording rules and alerts, `dashboards.py`
the dashboards; `generate.py` renders them to `monitoring/` and to the Helm chart's templates.
"""

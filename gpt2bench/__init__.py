"""gpt2bench: which data-parallel strategy, precision and scale should we train GPT-2 with?

Data flow: spec -> plan -> render -> run (cluster or local) -> train -> metrics -> collect -> report.
"""

# The one version: pyproject.toml reads it (dynamic), the default trainer images carry it (spec.py), the chart's
# version and appVersion and every generated manifest must equal it (tests/test_versions.py); a `v<version>` tag
# releases it (.github/workflows/release.yml). To bump: here, helm/gpt2bench/Chart.yaml, then `make generate`.
__version__ = "0.1.0"

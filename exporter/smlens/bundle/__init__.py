"""The monitoring bundle as code: Prometheus rules and Grafana dashboards, generated from the thresholds.

``python -m smlens.bundle rules --out rules/`` and ``python -m smlens.bundle dashboards --out dashboards/``
write the files the repository ships; ``--thresholds FILE`` applies overrides first.
"""

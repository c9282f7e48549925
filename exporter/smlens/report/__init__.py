"""``smlens report``: GPU-hours per verdict class and owner over a time range, read from Prometheus.

The method is :mod:`smlens.report.ledger`'s; the HTTP client :mod:`smlens.report.client`'s; the rows and
their formats :mod:`smlens.report.render`'s. Only the command imports the client, so that ``smlens serve``
never imports httpx.
"""

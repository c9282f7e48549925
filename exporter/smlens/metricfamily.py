"""Metric families as collectors build them: a name, a HELP text, a type and samples.

smlens' own small equivalent of the custom-collector types of prometheus_client
(``GaugeMetricFamily``, ``CounterMetricFamily``, ``Collector``, ``CollectorRegistry``), with the same
constructor arguments and the same samples: importing prometheus_client loaded 30 modules the exporter never
uses (its servers' http.server, socketserver, urllib.request, wsgiref) and cost it 1.3 MiB of resident memory
(docs/performance.md, "Memory"). Only what smlens exports is here: gauges and counters, no timestamps,
exemplars, units or ``_created`` samples.
:mod:`smlens.textformat` writes them out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar, NamedTuple, Protocol

# Prometheus' legacy name syntax without the colon, which is left to recording rules: both formats write
# such names as they are, without quoting or escaping.
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _check_name(name: str, what: str) -> None:
    if not _NAME.fullmatch(name) or (what == "label" and name.startswith("__")):
        raise ValueError(f"invalid {what} name {name!r}")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


class Metric:
    """One family. A counter's ``name`` has no ``_total``: its samples do (OpenMetrics' convention)."""

    __slots__ = ("documentation", "name", "samples", "type")

    def __init__(self, name: str, documentation: str, typ: str) -> None:
        _check_name(name, "metric")
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.samples: list[Sample] = []


class _Family(Metric):
    __slots__ = ("_labelnames", "_sample_name")
    _TYPE: ClassVar[str]

    def __init__(
        self,
        name: str,
        documentation: str,
        value: float | None = None,
        labels: Sequence[str] | None = None,
    ) -> None:
        """``value``: the family's one sample, unlabelled; or ``labels``, the label names of the samples that
        :meth:`add_metric` adds."""
        counter = self._TYPE == "counter"
        super().__init__(name.removesuffix("_total") if counter else name, documentation, self._TYPE)
        if labels is not None and value is not None:
            raise ValueError("a family takes either one value or label names, not both")
        for label in labels or ():
            _check_name(label, "label")
        self._labelnames = tuple(labels or ())
        self._sample_name = self.name + "_total" if counter else self.name
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        """One sample: ``labels`` are the values of the family's label names, in their order."""
        labelled = dict(zip(self._labelnames, labels, strict=True))
        self.samples.append(Sample(self._sample_name, labelled, value))


class GaugeMetricFamily(_Family):
    __slots__ = ()
    _TYPE = "gauge"


class CounterMetricFamily(_Family):
    """``name`` may end in ``_total`` or not: the family is the same."""

    __slots__ = ()
    _TYPE = "counter"


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class CollectorRegistry:
    """Collectors whose families are gathered, in the order registered, at each ``collect``."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def collect(self) -> Iterator[Metric]:
        for collector in tuple(self._collectors):
            yield from collector.collect()

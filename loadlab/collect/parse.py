"""Turn Prometheus exposition text into METRICS rows, cheaply enough for 10 Hz.

``prometheus_client.parser`` is the parser of record, but it costs ~25 ms for a
vLLM /metrics page: too much at 4 endpoints x 10 Hz. Between two scrapes of one
server only the values change, so :class:`ExpositionParser` memoises each
sample line's identity:

1. Split the text into lines; remember the latest ``# TYPE`` line; skip comments.
2. Cut each sample line at its last space: the left part (name and labels) is
   the key, the right part the value.
3. Unknown key: parse ``<type line>\\n<line>`` with prometheus_client and store
   what it says (family, type, labels) under the key: a series id, or DROP for
   samples loadlab does not keep (families starting with neither ``vllm:`` nor
   ``loadlab:``, the scheduler's refusal series of loadlab's simulator and probe; and the
   ``*_created`` timestamps prometheus_client adds to counters and histograms).
4. Known key: ``float(value)``, nothing else.

A line prometheus_client cannot parse (HTML, garbage, a truncated page) raises
:class:`ExpositionError`, so a scrape of garbage is a recorded failure, not a
silent empty sample. Lines carrying a timestamp are parsed fully every time.

Conventions kept from prometheus_client: a counter's *family* has no ``_total``
(``vllm:num_preemptions``) while its *metric* (sample name) is kept as exposed
(``vllm:num_preemptions_total``); ``untyped`` becomes ``unknown``. Labels are
stored as canonical JSON (sorted keys, no spaces) so equal label sets compare
equal as strings, whatever the source.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from loadlab.collect import catalog
from loadlab.runstore.schema import canonical_labels

KEEP_PREFIXES = ("vllm:", "loadlab:")
KEEP_NAME_REGEX = "(vllm|loadlab):.+"  # the same names, as a PromQL __name__ matcher
CACHE_CONFIG_FAMILY = "vllm:cache_config_info"
DROP = -1
_MAX_KEYS = 200_000  # forget memoised lines beyond this (label churn), rebuilt on demand


class ExpositionError(ValueError):
    """The text is not Prometheus exposition format (garbage, HTML, truncated)."""


@dataclass(frozen=True)
class Series:
    """The identity of one sample: everything but its value."""

    family: str
    type: str
    metric: str
    labels: str  # canonical JSON


@dataclass
class Scrape:
    """One parsed page: parallel lists of series ids and values."""

    ids: list[int] = field(default_factory=list)
    values: MutableSequence[float] = field(default_factory=list)   # or an array('d')


class ExpositionParser:
    """Memoising parser for one endpoint's successive /metrics pages.

    ``series[i]`` is the identity of series id ``i``; ids are stable for the
    parser's lifetime, so a writer can keep per-series columns once.
    """

    def __init__(self, keep_prefixes: tuple[str, ...] = KEEP_PREFIXES) -> None:
        self.keep_prefixes = keep_prefixes
        self.series: list[Series] = []
        self.families: dict[str, str] = {}  # family -> type, of kept samples
        self._ids: dict[Series, int] = {}
        self._keys: dict[str, int] = {}

    def parse(self, text: str) -> Scrape:
        """Parse one page; raises :class:`ExpositionError` on malformed text."""
        out = Scrape()
        add_id, add_value = out.ids.append, out.values.append
        known = self._keys.get
        type_line = ""
        for line in text.split("\n"):
            if not line or line[0] == "#":
                if line.startswith("# TYPE "):
                    type_line = line
                continue
            key, _, raw = line.rpartition(" ")
            sid = known(key)
            if sid is None:
                sid, value = self._learn(type_line, line, key)
            elif sid == DROP:
                continue
            else:
                try:
                    value = float(raw)
                except ValueError:
                    raise ExpositionError(f"bad sample value in line {line[:80]!r}") from None
            if sid != DROP:
                add_id(sid)
                add_value(value)
        return out

    def _learn(self, type_line: str, line: str, key: str) -> tuple[int, float]:
        """Parse one line with prometheus_client in its family's context."""
        try:
            families = list(text_string_to_metric_families(f"{type_line}\n{line}\n"))
        except Exception as exc:  # the parser raises ValueError, IndexError, ...
            raise ExpositionError(f"cannot parse line {line[:80]!r}: {exc}") from None
        samples = [(f, s) for f in families for s in f.samples]
        if len(samples) != 1:
            raise ExpositionError(f"cannot parse line {line[:80]!r}")
        family, sample = samples[0]
        ftype = "unknown" if family.type == "untyped" else family.type
        sid = self._series_id(family.name, ftype, _exposed_name(line),
                              canonical_labels(sample.labels))
        if sample.timestamp is None:
            if len(self._keys) >= _MAX_KEYS:
                self._keys.clear()
            self._keys[key] = sid
        return sid, float(sample.value)

    def _series_id(self, family: str, ftype: str, name: str, labels: str) -> int:
        """The id of a sample's series (a new one if unseen), or DROP where not kept."""
        if not name.startswith(self.keep_prefixes) or name.endswith("_created"):
            return DROP
        series = Series(family, ftype, name, labels)
        sid = self._ids.get(series)
        if sid is None:
            sid = len(self.series)
            self.series.append(series)
            self._ids[series] = sid
            self.families[family] = ftype
        return sid

    def learn(self, samples: Iterable[tuple[str, str, str, str, float]]) -> Scrape:
        """A page given as its samples already split into (family, type, metric, canonical
        labels, value), as prometheus_client's parser names them: the simulator's own
        (:meth:`loadlab.sim.engine.metrics.EngineMetrics.samples`), learnt without
        rendering and parsing its text, a prometheus_client parse per line (~12 ms a
        page, most of a replay's start-up). The same ids as :meth:`parse` of that page."""
        out = Scrape()
        for family, ftype, name, labels, value in samples:
            sid = self._series_id(family, ftype, name, labels)
            if sid != DROP:
                out.ids.append(sid)
                out.values.append(value)
        return out


def _exposed_name(line: str) -> str:
    """The sample name exactly as written (the parser may append ``_total``)."""
    end = len(line)
    for stop in ("{", " ", "\t"):
        at = line.find(stop)
        if 0 <= at < end:
            end = at
    return line[:end]


def scrape_rows(
    parser: ExpositionParser,
    scrape: Scrape,
    *,
    t: float,
    endpoint: str,
    scrape_s: float | None = None,
    source: str = "direct",
) -> list[dict[str, Any]]:
    """METRICS rows (dicts) of one parsed page: for tests and small tools."""
    rows = []
    for sid, value in zip(scrape.ids, scrape.values):
        s = parser.series[sid]
        rows.append(
            {"t": t, "scrape_s": scrape_s, "endpoint": endpoint, "family": s.family, "type": s.type,
                 "metric": s.metric, "labels": s.labels, "value": value, "source": source}
        )
    return rows


def parse_text(
    text: str, *, t: float, endpoint: str, source: str = "direct"
) -> list[dict[str, Any]]:
    """Parse one page into METRICS rows with a fresh parser."""
    parser = ExpositionParser()
    return scrape_rows(parser, parser.parse(text), t=t, endpoint=endpoint, source=source)


def _typed(text: str) -> Any:
    """'None' -> None, 'True' -> True, '64' -> 64, '0.92' -> 0.92, else the string."""
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def cache_config(label_sets: Iterable[dict[str, str] | str]) -> dict[str, Any]:
    """vLLM's ``cache_config_info`` labels as typed values (block_size=32, ...).

    Takes the label sets of that family's samples (dicts or canonical JSON); with
    several engines the first engine's set is returned and ``engines`` lists all.
    """
    sets = [json.loads(s) if isinstance(s, str) else dict(s) for s in label_sets]
    if not sets:
        return {}
    sets.sort(key=lambda d: d.get("engine", ""))
    config = {k: _typed(v) for k, v in sets[0].items() if k not in ("engine", "model_name")}
    config["engines"] = [d.get("engine") for d in sets]
    return config


def describe_endpoint(parser: ExpositionParser, ids: list[int]) -> dict[str, Any]:
    """What a parsed page exposes: families, role -> family map, V1/V0, typed cache config
    (the manifest's ``metrics.endpoints[...]`` entry)."""
    families = sorted(parser.families)
    config_labels = [
        parser.series[i].labels for i in ids if parser.series[i].family == CACHE_CONFIG_FAMILY
    ]
    return {
        "families": families,
        "names_found": catalog.names_found(families),
        "vllm_engine": catalog.engine_generation(families),
        "cache_config_info": cache_config(config_labels),
    }

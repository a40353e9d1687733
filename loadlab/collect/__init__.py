"""The collector: vLLM /metrics sampled beside a load, or read back from Prometheus.

- :mod:`~loadlab.collect.catalog`: the one table of vLLM metric names (V1 and V0-era) and roles
- :mod:`~loadlab.collect.parse`: exposition text -> METRICS rows (memoised prometheus_client parsing)
- :mod:`~loadlab.collect.scraper`: :class:`Scraper`, background sampling into a run folder
- :mod:`~loadlab.collect.prometheus`: the same rows read from a Prometheus server
- :mod:`~loadlab.collect.windows`: counter, histogram, gauge and coverage statistics per window
"""

from loadlab.collect.scraper import Scraper

__all__ = ["Scraper"]

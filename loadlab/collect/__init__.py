"""The collector: vLLM /metrics sampled beside a load, or read back from Prometheus.

- :mod:`~loadlab.collect.catalog`: the one table of vLLM metric names (V1 and V0-era) and roles
- :mod:`~loadlab.collect.parse`: exposition text -> METRICS rows (memoised prometheus_client
  parsing)
- :mod:`~loadlab.collect.scraper`: :class:`Scraper`, background sampling into a run folder
- :mod:`~loadlab.collect.prometheus`: the same rows read from a Prometheus server

Per-window statistics of what was collected are analysis: :mod:`loadlab.analyze.windows`.
The package imports nothing on its own, so the analyzer can read the catalog without
loading the scraper's threads and sockets.
"""

"""The HTML report of a run or sweep folder, and run-against-run comparison.

- :mod:`~loadlab.report.inputs`: read a run or sweep folder into points (manifest +
  analysis.json); the only module here that touches the folder's JSON files.
- :mod:`~loadlab.report.series`: gauges and the client's in-flight count over time.
- :mod:`~loadlab.report.ab`: A/B deltas per load level with bootstrap intervals.
- :mod:`~loadlab.report.summary`: the report's words and numbers (verdict rows, cards).
- :mod:`~loadlab.report.tables`: per-step, capacity and manifest tables.
- :mod:`~loadlab.report.plotkit`: the charts' look, a subplot canvas, axis helpers.
- :mod:`~loadlab.report.figures`: the plotly charts.
- :mod:`~loadlab.report.page`: the jinja2 page, written as one self-contained file.
- :mod:`~loadlab.report.compare`: `loadlab compare` (knee and SLO-limited level, CI gate).

plotly and jinja2 are imported only by ``plotkit``, ``figures`` and ``page``, so
``compare`` and the analyzer start without them.
"""

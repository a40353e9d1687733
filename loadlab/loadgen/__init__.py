"""The load generator: Locust users that stream OpenAI requests and record raw timings.

Modules (one job each):

- ``transport``: the one network seam (``Transport.open``) and its socket implementation.
- ``client``: SSE parsing and timing of one request -> ``Outcome`` (REQUESTS columns).
- ``prepare``: seq -> request (workload spec, calibrated prompt, deterministic id), prefetched.
- ``shapes``: load plans (closed-loop steps, open-loop rates, replay) and the arrival schedule.
- ``context``: per-process state shared by users; ``run_one`` = one request, one row.
- ``user``: Locust users and the master <-> worker message protocol.
- ``records``: the run folder's request/client tables and the worker-side batch sender.
- ``driver``: headless runs with Locust as a library (``run_load``); ``worker``: ``--join``.
- ``cli``: ``loadlab run``; ``locustfile``: plain ``locust -f`` with the web UI.

Importing this package imports nothing heavy; Locust (and its gevent monkey-patching)
comes in only with ``user``, ``driver``, ``worker`` and ``locustfile``.
"""

"""A load-generator worker process: ``loadlab run --join HOST:PORT``.

Kept apart from the driver so a worker imports only what sending needs (Locust,
the client, the workload), not the run-folder writers (pandas, pyarrow): workers
start faster and stay lean. Everything it needs arrives from the master in
``ll_config``; the API key comes from this machine's environment variable.

A worker the driver spawned on this machine dies with its master
(:func:`loadlab.lifeline.end_with_spawner`): left running, it would send full load,
unrecorded, until Locust's heartbeat timeout. One started by hand keeps Locust's rules.
"""

from __future__ import annotations

from locust.env import Environment

from loadlab.lifeline import end_with_spawner
from loadlab.loadgen.preflight import split_address
from loadlab.loadgen.user import LLMUser, OpenLoopUser, locust_link, serve_worker


def join_master(address: str) -> None:
    """Connect to the master at ``address`` and serve until it says quit."""
    end_with_spawner()
    host, port = split_address(address)
    env = Environment(user_classes=[LLMUser, OpenLoopUser])
    runner = env.create_worker_runner(host, port)
    serve_worker(env, locust_link(runner), runner.client_id)
    runner.greenlet.join()

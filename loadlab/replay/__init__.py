"""The virtual-time load driver: a load plan through the simulator's engine, no sockets.

A peer of :mod:`loadlab.loadgen`: the same plans and seeded workload, the same run
folder (requests, metrics, manifest), in seconds instead of minutes. driver
(``run_replay``), prompts (the workload's token ids, prefix sharing kept) and records
(engine outcomes as REQUESTS rows).
"""

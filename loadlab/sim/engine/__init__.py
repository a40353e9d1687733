"""The simulator's engine: vLLM V1's scheduler, block pool and step timing, clock-free.

types, config (SimConfig in vLLM's vocabulary), flags (flag values -> SimConfig),
hardware (GPU and model profiles, KV pool size), timing (roofline step time), blocks
(block pool with prefix caching), scheduler (token budget, seq cap, FCFS, preemption),
fastpath (decode-only steps in bulk), core (the engine loop) and metrics (the /metrics
families vLLM exposes). It imports nothing above runstore/spec, so the HTTP front
(:mod:`loadlab.sim.serve`) and the virtual-time driver (:mod:`loadlab.replay`) share it.
"""

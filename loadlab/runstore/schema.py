"""Column schemas of the run-folder tables.

Kept as pyarrow schemas so every writer produces identical column types and the
analyzer can rely on them (nullable ints stay ints, lists stay lists).
"""

from __future__ import annotations

import json

import pyarrow as pa

REQUEST_STATUSES = ("ok", "http_error", "timeout", "aborted", "client_error")

# One row per request, written by the load generator and by `loadlab sim replay`.
REQUESTS = pa.schema(
    [
        ("point", pa.string()),  # sweep point name ("" for a single run)
        ("step", pa.int32()),  # index of the load step (0-based)
        ("concurrency", pa.int32()),  # users active in the step (closed loop); null for open loop
        (
            "target_rate",
            pa.float64(),
        ),  # requests/s target of the step (open loop); null for closed loop
        ("worker", pa.string()),  # load-generator process that sent it
        ("user", pa.int32()),  # user index inside the worker
        ("request_id", pa.string()),  # deterministic from seed and sequence number
        ("seq", pa.int64()),  # position in the seeded request sequence
        ("endpoint", pa.string()),  # base URL it was sent to (no credentials)
        ("api", pa.string()),  # "completions" | "chat"
        ("t_scheduled", pa.float64()),  # when the plan wanted it sent (open loop / replay)
        ("t_issued", pa.float64()),  # when the client began it (before connecting); always set
        ("t_sent", pa.float64()),  # just before the request was written; null if never written
        ("t_first_token", pa.float64()),  # first chunk with non-empty content
        ("t_done", pa.float64()),  # last byte / error
        ("send_lag_s", pa.float64()),  # t_sent - t_scheduled
        ("ttft_s", pa.float64()),
        ("e2e_s", pa.float64()),
        ("itl_mean_s", pa.float64()),
        ("itl_p50_s", pa.float64()),
        ("itl_p99_s", pa.float64()),
        ("itl_max_s", pa.float64()),
        ("n_chunks", pa.int32()),  # content chunks received
        # Each content chunk, seconds after t_sent. Null in a replay's row whose tokens came
        # at successive step ends (token_timeline below): readers rebuild it.
        ("chunk_offsets_s", pa.list_(pa.float64())),
        ("prompt_tokens", pa.int32()),  # usage as the server reported it
        ("output_tokens", pa.int32()),
        ("target_prompt_tokens", pa.int32()),
        ("target_output_tokens", pa.int32()),
        ("prefix_group", pa.int32()),  # requests sharing a prefix share this id; null = none
        ("prefix_tokens", pa.int32()),  # length of the shared prefix
        ("status", pa.string()),  # one of REQUEST_STATUSES
        ("http_status", pa.int32()),
        ("error", pa.string()),
        # Added by loadgen (open loop / replay): latency as the workload saw it, counted from
        # t_scheduled, so time a request waited on the client (late send, in-flight cap) counts.
        ("ttft_from_scheduled_s", pa.float64()),
        ("e2e_from_scheduled_s", pa.float64()),
        # Which side failed (loadlab.runstore.failures); null for ok rows and in folders
        # written before the column existed (the analyzer infers it from status and error).
        ("failure", pa.string()),
        # A replay's token times without one float per token: a request that emitted at
        # every step end from its first token to its last has its n_chunks times at the
        # step ends token_step, token_step + 1, ... of STEP_ENDS' timeline token_timeline
        # (its replica), and chunk_offsets_s = those ends - t_sent_clock_s (t_sent on the
        # timeline's clock, the replay's virtual seconds; t_sent is that plus the epoch).
        # read_table rebuilds chunk_offsets_s from them (runstore.token_steps). Null in the
        # load generator's rows and in a replay's rows that skipped a step (preempted) or
        # have no token: those keep explicit chunk_offsets_s.
        ("token_timeline", pa.int32()),
        ("token_step", pa.int32()),
        ("t_sent_clock_s", pa.float64()),
    ]
)

# The step-end timelines a replay's requests point into (step_ends.parquet beside
# requests.parquet): one row per engine step end, per replica.
STEP_ENDS = pa.schema(
    [
        ("timeline", pa.int32()),  # the replica (REQUESTS.token_timeline)
        ("step", pa.int32()),      # 0, 1, ... per timeline (REQUESTS.token_step)
        ("t", pa.float64()),       # the step's end on the replay's clock (virtual seconds)
    ]
)

# The load generator watching itself: one row per worker per sampling interval
# (client.parquet; cut every second and at every step and warm-up edge, so a step's
# measured window is a union of whole rows), so the analyzer can tell "client
# limited" from a server stall.
CLIENT = pa.schema(
    [
        ("t", pa.float64()),  # end of the interval (unix s)
        ("worker", pa.string()),
        ("interval_s", pa.float64()),  # wall time covered
        ("cpu_s", pa.float64()),  # process CPU time (user + system) used in the interval
        ("cpu_frac", pa.float64()),  # cpu_s / interval_s: 1.0 = one core saturated
        (
            "loop_lag_mean_s",
            pa.float64(),
        ),  # event-loop lag: oversleep of a monitor greenlet's short sleeps
        ("loop_lag_max_s", pa.float64()),
        ("loop_lag_ticks", pa.int32()),  # sleeps measured (weights the mean across samples)
        ("in_flight", pa.int32()),  # requests open at the end of the interval
        ("inflight_s", pa.float64()),  # time integral of requests open (request-seconds), exact
        ("backoff_s", pa.float64()),  # same, of users pausing after a failed connection
        ("sent", pa.int32()),  # requests begun during the interval
        (
            "send_lags_s",
            pa.list_(pa.float64()),
        ),  # open loop: each begun request's lateness vs its schedule
    ]
)

# Long-format /metrics samples, raw (counters and histogram buckets as exposed).
METRICS = pa.schema(
    [
        ("t", pa.float64()),               # scrape start (or Prometheus sample time)
        ("scrape_s", pa.float64()),        # scrape duration; null from Prometheus
        ("endpoint", pa.string()),
        ("family", pa.string()),           # metric family, e.g. vllm:time_to_first_token_seconds
        ("type", pa.string()),             # counter | gauge | histogram | summary | info | unknown
        ("metric", pa.string()),           # sample name, e.g. ..._bucket, ..._total
        ("labels", pa.string()),           # canonical JSON object, sorted keys
        ("value", pa.float64()),
        ("source", pa.string()),           # "direct" | "prometheus" | "sim"
    ]
)

# One row per scrape attempt, so coverage and gaps are data, not log lines.
SCRAPES = pa.schema(
    [
        ("t", pa.float64()),
        ("endpoint", pa.string()),
        ("duration_s", pa.float64()),
        ("ok", pa.bool_()),
        ("http_status", pa.int32()),
        ("n_samples", pa.int32()),
        ("error", pa.string()),  # cause of a gap: timeout, refused, http 500, parse error...
    ]
)


def canonical_labels(labels: dict[str, str]) -> str:
    """Labels as JSON with sorted keys: the one spelling stored in METRICS.labels."""
    return json.dumps(labels, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

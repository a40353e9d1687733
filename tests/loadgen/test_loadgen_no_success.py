"""A server that is no OpenAI stream: its events are records, and a run with no success
exits 4 with one line naming the most common error (issue #17, items 7 and 12)."""

from __future__ import annotations

import json

import pytest
from runs import fault_server_process

from loadlab.loadgen.client import StreamingClient
from loadlab.loadgen.transport import SocketTransport


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_an_event_that_is_no_openai_chunk_is_a_record_naming_it(fault, api: str) -> None:
    pattern = "notobject,badshape,badjson,ok"
    body = {"model": "m", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "one two"}]
    else:
        body["prompt"] = "one two"
    with fault(pattern) as url:
        client = StreamingClient(SocketTransport(url), api, timeout_s=5)
        outs = [client.send(json.dumps(body).encode()) for _ in pattern.split(",")]
    assert [(o.status, o.http_status) for o in outs] == [
        ("client_error", 200), ("client_error", 200), ("client_error", 200), ("ok", 200)]
    assert outs[0].error == "not an OpenAI stream: an event that is not a JSON object: list"
    assert outs[1].error.startswith("unparseable response: AttributeError(")
    assert outs[2].error.startswith("unparseable response: JSONDecodeError(")
    assert [o.fields()["n_chunks"] for o in outs] == [1, 1, 1, 3]  # what came before counts


@pytest.mark.parametrize("pattern,status,needle", [
    ("notobject", "client_error",
     "client_error: not an OpenAI stream: an event that is not a JSON object: list"),
    ("hang", "timeout", "timeout: timeout after 0.5 s"),
    ("drop", "aborted", "aborted: "),
])
def test_a_run_in_which_no_request_succeeded_exits_4_naming_the_most_common_error(
        cli, load, tiny_profile, tmp_path, pattern, status, needle) -> None:
    out = tmp_path / pattern
    with fault_server_process(pattern) as (_, url):
        res = cli("--target", url, "--model", "m", "--profile", str(tiny_profile),
                  "--concurrency", "2", "--step-duration", "2", "--warmup", "0",
                  "--timeout", "0.5", "--workers", "0", "--drain", "1", "--out", str(out))
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 4, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("loadlab: error: no request succeeded (0 of "), last
    assert "the most common error, " in last and needle in last, last
    df, manifest = load(out)
    assert manifest["status"] == "complete" and manifest["records"]["rows"] == len(df) > 0
    assert "ok" not in set(df.status) and (df.status == status).sum() > len(df) / 2, df.status
    assert f"run complete: {len(df)} requests recorded in {out}" in res.stdout
    if pattern == "notobject":   # what came is named; nothing reads as cancelled by the run
        errors = set(df[df.status == "client_error"].error)
        assert errors == {"not an OpenAI stream: an event that is not a JSON object: list"}
        assert not df.error.str.contains("AttributeError").any()

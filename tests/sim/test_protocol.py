"""OpenAI request validation and response shapes, checked without a server."""

from __future__ import annotations

import json

import pytest

from loadlab.sim import protocol
from loadlab.sim.protocol import ProtocolError

MODEL = "sim-model"
LEN = 100


def completion(**body):
    return protocol.parse_completion(json.dumps(body).encode(), MODEL, LEN)


def chat(**body):
    return protocol.parse_chat(json.dumps(body).encode(), MODEL, LEN)


def error_of(fn, **body) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(**body)
    return info.value


def test_completion_defaults_follow_vllm():
    req = completion(prompt="a b c")
    assert req.max_tokens == 16                   # vLLM's CompletionRequest default
    assert req.model == MODEL and not req.stream and not req.include_usage
    assert req.request_id.startswith("cmpl-") and len(req.prompt_token_ids) == 3


def test_chat_without_max_tokens_gets_the_rest_of_the_context():
    req = chat(messages=[{"role": "user", "content": "a b c"}])
    assert len(req.prompt_token_ids) == 6
    assert req.max_tokens == LEN - 6
    assert req.request_id.startswith("chatcmpl-")


def test_max_completion_tokens_wins_over_max_tokens():
    req = chat(messages=[{"role": "user", "content": "x"}], max_tokens=9, max_completion_tokens=4)
    assert req.max_tokens == 4


def test_token_id_prompts_and_single_item_batches():
    assert completion(prompt=[5, 6, 7]).prompt_token_ids == [5, 6, 7]
    assert len(completion(prompt=["a b"]).prompt_token_ids) == 2
    assert completion(prompt=[[9, 10]]).prompt_token_ids == [9, 10]


def test_stream_options_include_usage():
    req = completion(prompt="a", stream=True, stream_options={"include_usage": True})
    assert req.stream and req.include_usage
    err = error_of(completion, prompt="a", stream_options={"include_usage": True})
    assert err.status == 400 and err.param == "stream_options"


def test_prompt_plus_max_tokens_over_context_is_400_like_vllm():
    err = error_of(completion, prompt=" ".join(["w"] * 90), max_tokens=20)
    body = json.loads(err.body())
    assert err.status == 400
    assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400
    assert body["error"]["param"] == "input_tokens"
    assert body["error"]["message"].startswith("This model's maximum context length is 100 tokens.")
    assert "110 tokens (90 in the messages, 20 in the completion)" in body["error"]["message"]


def test_chat_prompt_filling_the_context_is_400():
    err = error_of(chat, messages=[{"role": "user", "content": " ".join(["w"] * 97)}])
    assert err.status == 400 and "100 input tokens" in err.message


@pytest.mark.parametrize("body, field", [
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 99999]}, "prompt"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "a", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "a", "min_tokens": 20, "max_tokens": 5}, "min_tokens"),
    ({"prompt": "a", "temperature": "hot"}, "temperature"),
    ({"prompt": "a", "stream": "yes"}, "stream"),
    ({"prompt": "a", "n": 2}, "n"),
])
def test_bad_completion_fields_name_the_field(body, field):
    err = error_of(completion, **body)
    assert err.status == 400 and err.param == field
    assert field in err.message


@pytest.mark.parametrize("body, field", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
])
def test_bad_chat_fields_name_the_field(body, field):
    err = error_of(chat, **body)
    assert err.status == 400 and err.param == field


def test_malformed_json_and_non_objects_are_400():
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(ProtocolError) as info:
            protocol.parse_completion(raw, MODEL, LEN)
        assert info.value.status == 400 and info.value.param == "body"


def test_unknown_model_is_404_not_found():
    err = error_of(completion, prompt="a", model="other")
    body = json.loads(err.body())["error"]
    assert err.status == 404 and body["type"] == "NotFoundError"
    assert body["message"] == "The model `other` does not exist."


def _event(text: str) -> dict:
    assert text.startswith("data: ") and text.endswith("\n\n")
    return json.loads(text[len("data: "):-2])


def test_completion_chunks_have_vllms_shape():
    req = completion(prompt="a", stream=True)
    enc = protocol.StreamEncoder(req)
    assert _event(enc.chunk(' say "hi"', None)) == {
        "id": req.request_id, "object": "text_completion", "created": req.created,
        "model": MODEL, "choices": [{"index": 0, "text": ' say "hi"', "logprobs": None,
                                     "finish_reason": None, "stop_reason": None}]}
    assert _event(enc.chunk(" x", "length"))["choices"][0]["finish_reason"] == "length"
    assert _event(enc.usage_chunk(3, 4)) == {
        "id": req.request_id, "object": "text_completion", "created": req.created,
        "model": MODEL, "choices": [],
        "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4}}


def test_chat_chunks_have_vllms_shape():
    req = chat(messages=[{"role": "user", "content": "a"}], stream=True)
    enc = protocol.StreamEncoder(req)
    role = _event(enc.role_chunk())
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}]
    assert _event(enc.chunk(" w", None))["choices"][0]["delta"] == {"content": " w"}
    last = _event(enc.chunk(" z", "stop"))["choices"][0]
    assert last["finish_reason"] == "stop" and last["delta"] == {"content": " z"}


def test_full_responses_carry_usage():
    req = chat(messages=[{"role": "user", "content": "a b"}], max_tokens=3)
    body = protocol.full_response(req, " x y z", "length", 3)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " x y z",
                                             "tool_calls": []}
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}


def test_tokenize_accepts_prompt_or_messages():
    assert len(protocol.parse_tokenize(b'{"prompt": "a b c"}', MODEL)) == 3
    raw = json.dumps({"messages": [{"role": "user", "content": "a"}]}).encode()
    assert len(protocol.parse_tokenize(raw, MODEL)) == 4

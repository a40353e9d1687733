"""OpenAI request validation and response shapes, checked without a server."""

from __future__ import annotations

import json

import pytest

from loadlab.sim.serve import protocol
from loadlab.sim.serve.protocol import ProtocolError

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


def test_max_tokens_past_the_context_is_clamped_like_vllm_0_32():
    assert completion(prompt=" ".join(["w"] * 90), max_tokens=20).max_tokens == 10
    assert completion(prompt=[7] * 99, max_tokens=5).max_tokens == 1


def test_prompt_leaving_no_room_is_400_like_vllm():
    for err in (error_of(completion, prompt=" ".join(["w"] * 100), max_tokens=1),
                error_of(chat, messages=[{"role": "user", "content": " ".join(["w"] * 97)}])):
        body = json.loads(err.body())["error"]
        assert err.status == 400 and body["code"] == 400
        assert body["type"] == "BadRequestError" and body["param"] == "input_tokens"
        assert body["message"] == (
            "This model's maximum context length is 100 tokens. However, your prompt contains "
            "at least 100 input tokens, which exceeds this limit even without any output "
            "tokens. Please reduce the length of the input prompt. "
            "(parameter=input_tokens, value=100)")


# (body, param, error type, words the message must hold); params and types as vLLM 0.32
# answers: schema errors "Bad Request" with body.<field>, refusals "BadRequestError".
SCHEMA, REFUSAL = "Bad Request", "BadRequestError"


@pytest.mark.parametrize("body, param, err_type, needle", [
    ({}, "prompt", REFUSAL, "prompt"),
    ({"prompt": ""}, "prompt", REFUSAL, "prompt"),
    ({"prompt": "   "}, "prompt", REFUSAL, "word"),
    ({"prompt": 5}, "body.prompt", SCHEMA, "body.prompt"),
    ({"prompt": ["a", "b"]}, "prompt", REFUSAL, "one prompt per request"),
    ({"prompt": [1, 99999]}, None, REFUSAL, "Token id 99999 is out of vocabulary"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens", REFUSAL, "max_tokens must be at least 1"),
    ({"prompt": "a", "max_tokens": "ten"}, "body.max_tokens", SCHEMA, "whole number"),
    ({"prompt": "a", "min_tokens": 20, "max_tokens": 5}, None, REFUSAL, "min_tokens"),
    ({"prompt": "a", "temperature": "hot"}, "body.temperature", SCHEMA, "number"),
    ({"prompt": "a", "stream": "yes"}, "body.stream", SCHEMA, "true or false"),
    ({"prompt": "a", "n": 2}, "n", REFUSAL, "one choice"),
])
def test_bad_completion_requests_say_what_and_where(body, param, err_type, needle):
    err = error_of(completion, **body)
    assert err.status == 400 and err.param == param and err.err_type == err_type
    assert needle in err.message


@pytest.mark.parametrize("body, param, err_type, needle", [
    ({}, "body.messages", SCHEMA, "Field required"),
    ({"messages": "hi"}, "body.messages", SCHEMA, "list"),
    ({"messages": []}, None, REFUSAL, "empty conversation"),
    ({"messages": ["hi"]}, "body.messages.0", SCHEMA, "role"),
    ({"messages": [{"role": "user", "content": 5}]}, "body.messages.0.content", SCHEMA,
     "content"),
])
def test_bad_chat_requests_say_what_and_where(body, param, err_type, needle):
    err = error_of(chat, **body)
    assert err.status == 400 and err.param == param and err.err_type == err_type
    assert needle in err.message


def test_malformed_json_and_non_objects_are_400():
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(ProtocolError) as info:
            protocol.parse_completion(raw, MODEL, LEN)
        assert info.value.status == 400 and info.value.param == "body"
        assert info.value.err_type == "Bad Request"


def test_unknown_model_is_404_not_found():
    err = error_of(completion, prompt="a", model="other")
    body = json.loads(err.body())["error"]
    assert err.status == 404 and body["type"] == "NotFoundError"
    assert body["message"] == f"The model `other` does not exist. Valid aliases: {MODEL}."


def _event(text: str) -> dict:
    assert text.startswith("data: ") and text.endswith("\n\n")
    return json.loads(text[len("data: "):-2])


def test_completion_chunks_have_vllms_shape():
    req = completion(prompt="a", stream=True, stream_options={"include_usage": True})
    enc = protocol.StreamEncoder(req)
    head = {"id": req.request_id, "object": "text_completion", "created": req.created,
            "model": MODEL}
    choice = {"index": 0, "text": ' say "hi"', "logprobs": None, "finish_reason": None,
              "stop_reason": None, "prompt_token_ids": None, "token_ids": None}
    assert _event(enc.chunk(' say "hi"', None)) == {**head, "choices": [choice]}
    assert _event(enc.chunk(" x", "length"))["choices"][0]["finish_reason"] == "length"
    assert _event(enc.usage_chunk(3, 4)) == {
        **head, "choices": [],
        "usage": {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4},
        "system_fingerprint": protocol.SYSTEM_FINGERPRINT}
    # Without usage, the last chunk carries the fingerprint instead.
    plain = protocol.StreamEncoder(completion(prompt="a", stream=True))
    assert "system_fingerprint" not in _event(plain.chunk(" x", None))
    assert "system_fingerprint" in _event(plain.chunk(" x", "stop"))


def test_chat_chunks_have_vllms_shape():
    req = chat(messages=[{"role": "user", "content": "a"}], stream=True)
    enc = protocol.StreamEncoder(req)
    role = _event(enc.role_chunk())
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}]
    assert role["prompt_token_ids"] is None and role["prompt_text"] is None
    assert _event(enc.chunk(" w", None))["choices"][0]["delta"] == {"content": " w"}
    last = _event(enc.chunk(" z", "stop"))["choices"][0]
    assert last["finish_reason"] == "stop" and last["delta"] == {"content": " z"}


def test_full_responses_carry_usage():
    req = chat(messages=[{"role": "user", "content": "a b"}], max_tokens=3)
    body = protocol.full_response(req, " x y z", "length", 3)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == " x y z"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3,
                             "prompt_tokens_details": None, "completion_tokens_details": None}


def test_tokenize_accepts_prompt_or_messages():
    assert len(protocol.parse_tokenize(b'{"prompt": "a b c"}', MODEL)) == 3
    raw = json.dumps({"messages": [{"role": "user", "content": "a"}]}).encode()
    assert len(protocol.parse_tokenize(raw, MODEL)) == 4

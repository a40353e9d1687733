"""OpenAI request parsing and response encoding, shaped as vLLM's OpenAI server does.

Shapes were read from vLLM's ``vllm/entrypoints/openai`` (completion/chat protocol
and serving modules, engine/protocol.py) so a client that works against ``vllm serve``
works against the simulator unchanged:

- Completions stream chunk: ``{"id":"cmpl-..","object":"text_completion","created":..,
  "model":..,"choices":[{"index":0,"text":..,"logprobs":null,"finish_reason":..,
  "stop_reason":null}]}``.
- Chat stream: a role chunk (``delta {"role":"assistant","content":""}``) with the first
  token, then ``delta {"content":..}`` chunks; the last carries ``finish_reason``.
- ``stream_options.include_usage`` adds a final chunk with ``choices: []`` and
  ``usage {prompt_tokens, total_tokens, completion_tokens}``; then ``data: [DONE]``.
- Errors: ``{"error": {"message", "type", "param", "code"}}``; 400 ``BadRequestError``
  for bad input (prompt + max_tokens over max_model_len included), 404 ``NotFoundError``
  for an unknown model.

Defaults as in vLLM: completions ``max_tokens`` 16; chat ``max_completion_tokens`` /
``max_tokens`` absent means "the rest of the context" (max_model_len - prompt length).
Sampling fields (temperature, top_p, seed, stop, ...) are type-checked and ignored:
the simulator does not sample text. ``n`` > 1 and lists of several prompts are refused
with a 400 that says so, rather than half-served.

Stream chunks are built by string concatenation around a per-request prefix, not by
``json.dumps`` of a dict, because they are encoded once per token per request.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from loadlab.sim import tokenizer

DONE = b"data: [DONE]\n\n"


class ProtocolError(Exception):
    """A request the server answers with an OpenAI error body instead of a completion."""

    def __init__(self, status: int, message: str, *, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.err_type, self.param)


def error_body(status: int, message: str, err_type: str, param: str | None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    ).encode()


def bad(field: str, message: str) -> ProtocolError:
    return ProtocolError(400, message, param=field)


@dataclass
class GenerationRequest:
    """A validated completion or chat request, lengths resolved."""

    kind: str                      # "completion" | "chat"
    request_id: str                # "cmpl-<hex>" or "chatcmpl-<hex>"
    created: int
    model: str
    prompt_token_ids: list[int]
    max_tokens: int                # resolved (default applied), >= 1
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


# ---------------------------------------------------------------- parsing helpers

def load_body(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body or raise a 400 that says what was wrong."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(
            400, f"Request body is not valid JSON ({exc}); send a JSON object with "
            "Content-Type: application/json.", param="body") from None
    if not isinstance(body, dict):
        raise ProtocolError(400, "Request body must be a JSON object, e.g. "
                            '{"model": "...", "prompt": "..."}.', param="body")
    return body


def _opt_int(body: dict[str, Any], field: str, minimum: int) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(field, f"`{field}` must be an integer, got {json.dumps(value)[:40]}.")
    if value < minimum:
        raise bad(field, f"`{field}` must be at least {minimum}, got {value}.")
    return value


def _opt_bool(body: dict[str, Any], field: str) -> bool:
    value = body.get(field, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(field, f"`{field}` must be true or false, got {json.dumps(value)[:40]}.")
    return value


_NUMERIC_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "seed")


def _check_model(body: dict[str, Any], served_model: str) -> str:
    """The served name; 404 as vLLM for any other name. ``model`` may be omitted."""
    model = body.get("model")
    if model is None:
        return served_model
    if not isinstance(model, str):
        raise bad("model", "`model` must be a string naming the served model.")
    if model != served_model:
        raise ProtocolError(404, f"The model `{model}` does not exist.",
                            err_type="NotFoundError", param="model")
    return model


def _check_common(body: dict[str, Any], served_model: str) -> tuple[str, bool, bool]:
    """Model, stream and include_usage; type checks of ignored sampling fields."""
    model = _check_model(body, served_model)
    for field in _NUMERIC_FIELDS:
        value = body.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise bad(field, f"`{field}` must be a number, got {json.dumps(value)[:40]}.")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise bad("n", "The simulator generates one choice per request; send `n: 1` or omit it.")
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad("stream_options", '`stream_options` must be an object such as '
                      '{"include_usage": true}.')
        if not stream:
            raise bad("stream_options", "Stream options can only be defined when `stream=True`.")
        include_usage = bool(options.get("include_usage", True))
    return model, stream, include_usage


def _resolve_lengths(prompt_len: int, max_tokens: int | None, min_tokens: int,
                     max_model_len: int) -> int:
    """Apply vLLM's default and context-length checks; return the resolved max_tokens."""
    if max_tokens is None:
        if prompt_len >= max_model_len:
            raise ProtocolError(
                400, f"This model's maximum context length is {max_model_len} tokens. "
                f"However, your request has {prompt_len} input tokens. Please reduce the "
                "length of the input messages.", param="input_tokens")
        max_tokens = max_model_len - prompt_len
    elif prompt_len + max_tokens > max_model_len:
        raise ProtocolError(
            400, f"This model's maximum context length is {max_model_len} tokens. However, "
            f"you requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.", param="input_tokens")
    if min_tokens > max_tokens:
        raise bad("min_tokens", f"min_tokens must be less than or equal to max_tokens="
                  f"{max_tokens}, got {min_tokens}.")
    return max_tokens


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(16).hex()


# ---------------------------------------------------------------- prompts

def prompt_ids(body: dict[str, Any]) -> list[int]:
    """Token ids of a completions ``prompt``: text, or a list of token ids."""
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "Field `prompt` is required: send the text to complete as a "
                  "string, or token ids as a list of integers.")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]           # a batch of one prompt
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
        if not ids:
            raise bad("prompt", "`prompt` must contain at least one word (the simulator "
                      "counts whitespace-separated pieces as tokens).")
        return ids
    if isinstance(prompt, list):
        if prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            for x in prompt:
                if not 0 <= x < tokenizer.VOCAB_SIZE:
                    raise bad("prompt", f"`prompt` token id {x} is out of vocabulary "
                              f"(0..{tokenizer.VOCAB_SIZE - 1}).")
            return list(prompt)
        if len(prompt) > 1 and all(isinstance(x, (str, list)) for x in prompt):
            raise bad("prompt", "The simulator serves one prompt per request; send a "
                      "single string or token-id list and issue separate requests.")
    raise bad("prompt", "`prompt` must be a non-empty string or a non-empty list of "
              "integer token ids.")


def chat_ids(body: dict[str, Any]) -> list[int]:
    """Token ids of ``messages`` under the simulator's chat template."""
    messages = body.get("messages")
    if messages is None:
        raise bad("messages", 'Field `messages` is required: send a list such as '
                  '[{"role": "user", "content": "Hello"}].')
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "`messages` must be a non-empty list of "
                  "{\"role\": ..., \"content\": ...} objects.")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"messages[{i}]", f"messages[{i}] must be an object with a string "
                      "`role` (system, user, assistant, ...) and a `content`.")
        try:
            text = tokenizer.message_text(message.get("content"))
        except TypeError as exc:
            raise bad(f"messages[{i}].content", f"messages[{i}].content: {exc}.") from None
        turns.append((message["role"], text))
    return tokenizer.encode_chat(turns)


# ---------------------------------------------------------------- request parsers

def parse_completion(raw: bytes, served_model: str, max_model_len: int) -> GenerationRequest:
    body = load_body(raw)
    model, stream, include_usage = _check_common(body, served_model)
    ids = prompt_ids(body)
    max_tokens = _opt_int(body, "max_tokens", 1)
    if "max_tokens" not in body or body.get("max_tokens") is None:
        max_tokens = 16             # vLLM's CompletionRequest default
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    return GenerationRequest(
        kind="completion", request_id=_new_id("cmpl-"), created=int(time.time()),
        model=model, prompt_token_ids=ids,
        max_tokens=_resolve_lengths(len(ids), max_tokens, min_tokens, max_model_len),
        min_tokens=min_tokens, ignore_eos=_opt_bool(body, "ignore_eos"),
        stream=stream, include_usage=include_usage)


def parse_chat(raw: bytes, served_model: str, max_model_len: int) -> GenerationRequest:
    body = load_body(raw)
    model, stream, include_usage = _check_common(body, served_model)
    ids = chat_ids(body)
    max_tokens = _opt_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1)
    min_tokens = _opt_int(body, "min_tokens", 0) or 0
    return GenerationRequest(
        kind="chat", request_id=_new_id("chatcmpl-"), created=int(time.time()),
        model=model, prompt_token_ids=ids,
        max_tokens=_resolve_lengths(len(ids), max_tokens, min_tokens, max_model_len),
        min_tokens=min_tokens, ignore_eos=_opt_bool(body, "ignore_eos"),
        stream=stream, include_usage=include_usage)


def parse_tokenize(raw: bytes, served_model: str) -> list[int]:
    """Token ids for vLLM's ``/tokenize``: ``{"prompt": ...}`` or ``{"messages": [...]}``."""
    body = load_body(raw)
    _check_model(body, served_model)
    if "messages" in body:
        return chat_ids(body)
    return prompt_ids(body)


# ---------------------------------------------------------------- responses

def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


class StreamEncoder:
    """SSE events of one streamed request; the constant JSON around the text is built once."""

    def __init__(self, req: GenerationRequest) -> None:
        self.kind = req.kind
        head = (f'{{"id":"{req.request_id}","object":'
                f'"{"text_completion" if req.kind == "completion" else "chat.completion.chunk"}"'
                f',"created":{req.created},"model":{json.dumps(req.model)},')
        self._head = "data: " + head
        if req.kind == "completion":
            self._open = self._head + '"choices":[{"index":0,"text":'
            self._more = ',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self._last = ',"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'
        else:
            self._open = self._head + '"choices":[{"index":0,"delta":{"content":'
            self._more = '},"logprobs":null,"finish_reason":null}]}\n\n'
            self._last = '},"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'

    def role_chunk(self) -> str:
        """Chat only: the first event, sent with the first token."""
        return (self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}]}\n\n')

    def chunk(self, text: str, finish_reason: str | None) -> str:
        """One event carrying ``text``; ``finish_reason`` set on the last one."""
        tail = self._more if finish_reason is None else self._last % finish_reason
        return self._open + json.dumps(text) + tail

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        return (self._head + '"choices":[],"usage":'
                + json.dumps(usage(prompt_tokens, completion_tokens), separators=(",", ":"))
                + "}\n\n")


def full_response(req: GenerationRequest, text: str, finish_reason: str,
                  completion_tokens: int) -> dict[str, Any]:
    """The non-streaming body of a finished request."""
    if req.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                  "finish_reason": finish_reason, "stop_reason": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                          "tool_calls": []},
                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        obj = "chat.completion"
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model,
            "choices": [choice],
            "usage": usage(len(req.prompt_token_ids), completion_tokens)}


def models_list(served_model: str, max_model_len: int, root: str) -> dict[str, Any]:
    """``GET /v1/models`` as vLLM shapes its ModelList/ModelCard."""
    created = int(time.time())
    return {"object": "list", "data": [{
        "id": served_model, "object": "model", "created": created, "owned_by": "vllm",
        "root": root, "parent": None, "max_model_len": max_model_len,
        "permission": [{
            "id": _new_id("modelperm-"), "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False}],
    }]}

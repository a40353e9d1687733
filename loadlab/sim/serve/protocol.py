"""OpenAI request parsing and response encoding, shaped as vLLM's OpenAI server does.

Shapes were read from vLLM's ``vllm/entrypoints/openai`` (completion/chat protocol and
serving modules) and then checked byte for byte against a real vLLM 0.32 server
(captured in ``tests/sim/fixtures/vllm-0.32-openai.json``, compared by
``tests/sim/test_protocol.py``), so a client that works against ``vllm serve`` works
against the simulator unchanged:

- Completions stream chunk: ``{"id":"cmpl-<16 hex>","object":"text_completion",
  "created":..,"model":..,"choices":[{"index":0,"text":..,"logprobs":null,
  "finish_reason":..,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}``.
- Chat stream: a role chunk (``delta {"role":"assistant","content":""}``) with the first
  token, then ``delta {"content":..}`` chunks; the last carries ``finish_reason``.
- ``stream_options.include_usage`` adds a final chunk with ``choices: []`` and
  ``usage {prompt_tokens, total_tokens, completion_tokens}``; then ``data: [DONE]``.
  The last event before ``[DONE]`` carries ``system_fingerprint``.
- Errors: ``{"error": {"message", "type", "param", "code"}}``. A body that fails the
  schema (not JSON, missing or mistyped field) gets type ``Bad Request`` and param
  ``body.<field>``, as vLLM's pydantic layer answers; a request vLLM refuses on its
  merits gets ``BadRequestError`` (a prompt leaving no room for one output token:
  "This model's maximum context length is ..."); an unknown model 404 ``NotFoundError``.

Lengths as in vLLM 0.32: completions ``max_tokens`` defaults to 16; chat
``max_completion_tokens`` / ``max_tokens`` absent means the rest of the context; a
``max_tokens`` past the context is clamped to ``max_model_len - prompt_len`` (vLLM 0.32
answers 200 and stops at the context end), not refused. Sampling fields (temperature,
top_p, seed, stop, ...) are type-checked and ignored: the simulator samples no text.
``n`` > 1 and lists of several prompts are refused with a 400 that says so.

Stream chunks are built by string concatenation around a per-request prefix, not by
``json.dumps`` of a dict, because they are encoded once per token per request.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from loadlab.sim.serve import tokenizer
from loadlab.version import __version__

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


_UNSET = object()


def invalid(field: str, what: str) -> ProtocolError:
    """A body that fails the request schema (missing field, wrong type, not JSON).

    vLLM answers these from its pydantic models: type ``Bad Request``, param
    ``body.<field>``. The message names the field, what was wrong and the fix.
    """
    loc = f"body.{field}" if field else "body"
    return ProtocolError(400, f"1 validation error: {loc}: {what}", err_type="Bad Request",
                         param=loc)


def rejected(message: str, param: str | None = None, value: object = _UNSET) -> ProtocolError:
    """A well-formed request vLLM refuses (its VLLMValidationError wording and suffix)."""
    if param is not None:
        message += f" (parameter={param}" + ("" if value is _UNSET else f", value={value}") + ")"
    return ProtocolError(400, message, param=param)


@dataclass
class GenerationRequest:
    """A validated completion or chat request, lengths resolved."""

    kind: str                      # "completion" | "chat"
    request_id: str                # "cmpl-<hex>" or "chatcmpl-<hex>"
    created: int
    model: str
    prompt_token_ids: list[int]
    max_tokens: int                # resolved (default applied, clamped to the context), >= 1
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
        raise invalid("", f"JSON decode error ({exc}); send a JSON object with "
                      "Content-Type: application/json.") from None
    if not isinstance(body, dict):
        raise invalid("", 'Input should be a JSON object, e.g. {"model": "...", '
                      '"prompt": "..."}.')
    return body


def _shown(value: object) -> str:
    return json.dumps(value)[:40]


def _opt_int(body: dict[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(field, f"Input should be a valid integer, got {_shown(value)}; "
                      f"send `{field}` as a whole number.")
    return value


def _opt_bool(body: dict[str, Any], field: str) -> bool:
    value = body.get(field, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(field, f"Input should be a valid boolean, got {_shown(value)}; "
                      "send true or false.")
    return value


_NUMERIC_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                   "frequency_penalty", "repetition_penalty", "seed")


def _check_model(body: dict[str, Any], served_model: str) -> str:
    """The served name; 404 as vLLM for any other name. ``model`` may be omitted."""
    model = body.get("model")
    if model is None:
        return served_model
    if not isinstance(model, str):
        raise invalid("model", "Input should be a valid string naming the served model.")
    if model != served_model:
        raise ProtocolError(404, f"The model `{model}` does not exist. Valid aliases: "
                            f"{served_model}.", err_type="NotFoundError", param="model")
    return model


def _check_common(body: dict[str, Any], served_model: str) -> tuple[str, bool, bool]:
    """Model, stream and include_usage; type checks of ignored sampling fields."""
    model = _check_model(body, served_model)
    for field in _NUMERIC_FIELDS:
        value = body.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise invalid(field, f"Input should be a valid number, got {_shown(value)}.")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise rejected("The simulator generates one choice per request; send `n: 1` or omit "
                       "it.", "n", n)
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("stream_options", 'Input should be an object such as '
                          '{"include_usage": true}.')
        if not stream:
            raise rejected("Stream options can only be defined when `stream=True`.",
                           "stream_options")
        include_usage = bool(options.get("include_usage", True))
    return model, stream, include_usage


def _resolve_lengths(prompt_len: int, max_tokens: int | None, min_tokens: int,
                     max_model_len: int) -> int:
    """vLLM 0.32's rules: a prompt must leave room for one output token; ``max_tokens``
    (default: the rest of the context) is clamped to ``max_model_len - prompt_len``."""
    if prompt_len >= max_model_len:
        raise rejected(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains at least {prompt_len} input tokens, which exceeds this limit "
            "even without any output tokens. Please reduce the length of the input prompt.",
            "input_tokens", prompt_len)
    if max_tokens is not None and max_tokens < 1:
        raise rejected(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens",
                       max_tokens)
    room = max_model_len - prompt_len
    max_tokens = room if max_tokens is None else min(max_tokens, room)
    if min_tokens < 0:
        raise rejected(f"min_tokens must be greater than or equal to 0, got {min_tokens}.",
                       "min_tokens", min_tokens)
    if min_tokens > max_tokens:
        raise rejected(f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                       f"got {min_tokens}.")
    return max_tokens


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(8).hex()      # vLLM 0.32: "cmpl-" + 16 hex digits


# ---------------------------------------------------------------- prompts

def prompt_ids(body: dict[str, Any]) -> list[int]:
    """Token ids of a completions ``prompt``: text, or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]           # a batch of one prompt
    if prompt is None or prompt == "" or prompt == []:
        raise rejected("Either prompt or prompt_embeds must be provided and non-empty.",
                       "prompt")
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
        if not ids:
            raise rejected("The prompt has no tokens: the simulator counts whitespace-"
                           "separated words as tokens; send at least one word.", "prompt")
        return ids
    if isinstance(prompt, list):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            for x in prompt:
                if not 0 <= x < tokenizer.VOCAB_SIZE:
                    raise rejected(f"Token id {x} is out of vocabulary")
            return list(prompt)
        if len(prompt) > 1 and all(isinstance(x, (str, list)) for x in prompt):
            raise rejected("The simulator serves one prompt per request; send a single "
                           "string or token-id list and issue separate requests.", "prompt")
    raise invalid("prompt", "Input should be a valid string or a list of integer token ids; "
                  "send the text to complete, or its token ids.")


def chat_ids(body: dict[str, Any]) -> list[int]:
    """Token ids of ``messages`` under the simulator's chat template."""
    messages = body.get("messages")
    if messages is None:
        raise invalid("messages", 'Field required; send a list such as '
                      '[{"role": "user", "content": "Hello"}].')
    if not isinstance(messages, list):
        raise invalid("messages", 'Input should be a valid list of '
                      '{"role": ..., "content": ...} objects.')
    if not messages:
        raise rejected("Cannot apply chat template to an empty conversation. Provide at "
                       "least one message.")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid(f"messages.{i}", "Input should be an object with a string `role` "
                          "(system, user, assistant, ...) and a `content`.")
        try:
            text = tokenizer.message_text(message.get("content"))
        except TypeError as exc:
            raise invalid(f"messages.{i}.content", f"{exc}.") from None
        turns.append((message["role"], text))
    return tokenizer.encode_chat(turns)


# ---------------------------------------------------------------- request parsers

def _generation(kind: str, body: dict[str, Any], ids: list[int], model: str, stream: bool,
                include_usage: bool, max_tokens: int | None, max_model_len: int
                ) -> GenerationRequest:
    min_tokens = _opt_int(body, "min_tokens") or 0
    return GenerationRequest(
        kind=kind, request_id=_new_id("cmpl-" if kind == "completion" else "chatcmpl-"),
        created=int(time.time()), model=model, prompt_token_ids=ids,
        max_tokens=_resolve_lengths(len(ids), max_tokens, min_tokens, max_model_len),
        min_tokens=min_tokens, ignore_eos=_opt_bool(body, "ignore_eos"),
        stream=stream, include_usage=include_usage)


def parse_completion(raw: bytes, served_model: str, max_model_len: int) -> GenerationRequest:
    body = load_body(raw)
    model, stream, include_usage = _check_common(body, served_model)
    ids = prompt_ids(body)
    max_tokens = _opt_int(body, "max_tokens")
    if max_tokens is None:
        max_tokens = 16             # vLLM's CompletionRequest default (null means it too)
    return _generation("completion", body, ids, model, stream, include_usage, max_tokens,
                       max_model_len)


def parse_chat(raw: bytes, served_model: str, max_model_len: int) -> GenerationRequest:
    body = load_body(raw)
    model, stream, include_usage = _check_common(body, served_model)
    ids = chat_ids(body)
    max_tokens = _opt_int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens")
    return _generation("chat", body, ids, model, stream, include_usage, max_tokens,
                       max_model_len)


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


SYSTEM_FINGERPRINT = f"loadlab-sim-{__version__}"
_FP = f',"system_fingerprint":"{SYSTEM_FINGERPRINT}"'


class StreamEncoder:
    """SSE events of one streamed request; the constant JSON around the text is built once.

    Field sets and order are those a vLLM 0.32 server sends (captured from a real one):
    completions choices carry ``prompt_token_ids``/``token_ids`` nulls; the chat role
    chunk carries top-level ``prompt_token_ids``/``prompt_text`` nulls; the last chunk,
    or the usage chunk when usage is on, carries ``system_fingerprint``.
    """

    def __init__(self, req: GenerationRequest) -> None:
        obj = "text_completion" if req.kind == "completion" else "chat.completion.chunk"
        self._head = (f'data: {{"id":"{req.request_id}","object":"{obj}",'
                      f'"created":{req.created},"model":{json.dumps(req.model)},')
        end = "}\n\n" if req.include_usage else _FP + "}\n\n"
        if req.kind == "completion":
            self._open = self._head + '"choices":[{"index":0,"text":'
            nulls = ',"prompt_token_ids":null,"token_ids":null}]'
            self._more = (
                ',"logprobs":null,"finish_reason":null,"stop_reason":null' + nulls + "}\n\n"
            )
            self._last = ',"logprobs":null,"finish_reason":"%s","stop_reason":null' + nulls + end
        else:
            self._open = self._head + '"choices":[{"index":0,"delta":{"content":'
            self._more = '},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            self._last = (
                '},"logprobs":null,"finish_reason":"%s","stop_reason":null,"token_ids":null}]' + end
            )

    def role_chunk(self) -> str:
        """Chat only: the first event, sent with the first token."""
        return (self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,'
                '"prompt_text":null}\n\n')

    def chunk(self, text: str, finish_reason: str | None) -> str:
        """One event carrying ``text``; ``finish_reason`` set on the last one."""
        tail = self._more if finish_reason is None else self._last % finish_reason
        return self._open + json.dumps(text) + tail

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        return (self._head + '"choices":[],"usage":'
                + json.dumps(usage(prompt_tokens, completion_tokens), separators=(",", ":"))
                + _FP + "}\n\n")


def full_response(req: GenerationRequest, text: str, finish_reason: str,
                  completion_tokens: int) -> dict[str, Any]:
    """The non-streaming body of a finished request (vLLM 0.32's fields, in its order)."""
    use = {**usage(len(req.prompt_token_ids), completion_tokens),
           "prompt_tokens_details": None, "completion_tokens_details": None}
    if req.kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None,
                                  "finish_reason": finish_reason, "stop_reason": None,
                                  "token_ids": None, "prompt_logprobs": None,
                                  "prompt_token_ids": None, "routed_experts": None}
        head: dict[str, Any] = {"id": req.request_id, "object": "text_completion"}
        tail: dict[str, Any] = {}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                          "annotations": None, "audio": None,
                                          "function_call": None, "reasoning": None},
                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None,
                  "token_ids": None, "routed_experts": None}
        head = {"id": req.request_id, "object": "chat.completion"}
        tail = {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
    return {**head, "created": req.created, "model": req.model, "choices": [choice],
            "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": use,
            **tail, "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


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

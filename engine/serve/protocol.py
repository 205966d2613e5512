"""The OpenAI API as this server speaks it: request bodies, their checks, and the response shapes.

A bad request gets a 400 whose body names the field, as OpenAI's and vLLM's do:
{"error": {"message": ..., "type": "invalid_request_error", "param": "<field>", "code": null}}.
Fields a client may send that we do not act on (user, logit_bias, ...) are accepted and ignored;
extensions from vLLM that load tests use are honoured: ignore_eos, min_tokens, top_k.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.headers = status, message, param, type_, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": None}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int = 1


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | None = None


class ChatBody(_Body):
    messages: list[dict] | None = None
    max_completion_tokens: int | None = None


@dataclass
class Params:
    """A checked request: what the engine needs, and what the response must say."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool
    min_tokens: int
    model: str


def parse(kind: str, raw: dict, served_name: str, tokenizer, max_model_len: int, default_max_tokens: int) -> Params:
    """Check a request body; APIError(400, ..., param) names the first bad field."""
    if not isinstance(raw, dict):
        raise APIError(400, "the request body must be a JSON object", None)
    try:
        body = (CompletionBody if kind == "completions" else ChatBody).model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"] if not isinstance(p, int)) or None
        raise APIError(400, f"{field}: {err['msg']}", field) from None
    if body.model is not None and body.model != served_name:
        raise APIError(400, f"the model '{body.model}' does not exist; this server serves '{served_name}'", "model",
                       "invalid_request_error")
    if body.n != 1:
        raise APIError(400, f"n = {body.n} is not supported; ask for one choice per request", "n")
    if kind == "completions":
        ids = _prompt_ids(body.prompt, tokenizer)
    else:
        ids = _chat_ids(body.messages, tokenizer)
    max_tokens = body.max_completion_tokens if kind == "chat" and body.max_completion_tokens is not None \
        else body.max_tokens
    field = "max_completion_tokens" if kind == "chat" and body.max_completion_tokens is not None else "max_tokens"
    room = max_model_len - len(ids)
    if max_tokens is None:
        max_tokens = max(1, min(default_max_tokens, room))
    if max_tokens < 1:
        raise APIError(400, f"{field} is {max_tokens}; ask for at least 1 token", field)
    if len(ids) + max_tokens > max_model_len:
        raise APIError(400, f"this model's maximum context length is {max_model_len} tokens; the prompt has "
                            f"{len(ids)} and {field} asks for {max_tokens} more"
                            + (f"; ask for at most {room} tokens" if room >= 1 else "; shorten the prompt"), field)
    t = 1.0 if body.temperature is None else body.temperature
    if not math.isfinite(t) or t < 0 or t > 100:
        raise APIError(400, f"temperature {t} is out of range; use 0 (greedy) or a positive value up to 100", "temperature")
    p = 1.0 if body.top_p is None else body.top_p
    if not math.isfinite(p) or not 0 < p <= 1:
        raise APIError(400, f"top_p {p} is out of range; use a value in (0, 1]", "top_p")
    k = 0 if body.top_k in (None, -1) else body.top_k
    if k < 0:
        raise APIError(400, f"top_k {body.top_k} is out of range; use -1 or 0 (off) or a positive number", "top_k")
    if body.seed is not None and body.seed < 0:
        raise APIError(400, f"seed {body.seed} is negative", "seed")
    if body.min_tokens < 0 or body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens {body.min_tokens} must be between 0 and max_tokens ({max_tokens})",
                       "min_tokens")
    usage = bool((body.stream_options or {}).get("include_usage"))
    return Params(ids, int(max_tokens), float(t), float(p), int(k), body.seed, bool(body.stream), usage,
                  bool(body.ignore_eos), int(body.min_tokens), served_name)


def _prompt_ids(prompt, tokenizer) -> list[int]:
    if prompt is None:
        raise APIError(400, "prompt is required", "prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "a list of several prompts is not supported; send one prompt per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt is empty", "prompt")
        return list(tokenizer(prompt)["input_ids"])
    vocab = len(tokenizer)
    if not prompt or any(not 0 <= t < vocab for t in prompt):
        raise APIError(400, f"prompt token ids must be a non-empty list of ids in [0, {vocab})", "prompt")
    return list(prompt)


ROLES = ("system", "user", "assistant", "tool", "developer")


def _chat_ids(messages, tokenizer) -> list[int]:
    if not messages:
        raise APIError(400, "messages is required and must not be empty", "messages")
    msgs = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise APIError(400, f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}", "messages")
        if isinstance(content, list):  # OpenAI's content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be text", "messages")
        msgs.append({"role": "system" if role == "developer" else role, "content": content})
    ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


# ---------------------------------------------------------------- responses

def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completions" else "chatcmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def full_response(kind: str, rid: str, model: str, text: str, finish: str, u: dict) -> dict:
    created = int(time.time())
    if kind == "completions":
        return {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], "usage": u}
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}], "usage": u}


def chunk(kind: str, rid: str, model: str, text: str | None, finish: str | None = None, role: bool = False,
          u: dict | None = None) -> dict:
    created = int(time.time())
    if u is not None:
        return {"id": rid, "object": "text_completion" if kind == "completions" else "chat.completion.chunk",
                "created": created, "model": model, "choices": [], "usage": u}
    if kind == "completions":
        return {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}
    delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

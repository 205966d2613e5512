"""The OpenAI API as this server speaks it: request bodies, their checks, and the response shapes.

A bad request gets a 400 whose body names the field, as OpenAI's and vLLM's do:
{"error": {"message": ..., "type": "invalid_request_error", "param": "<field>", "code": null}}.
Every field a body may carry is honoured, accepted and ignored because it changes nothing about the
answer (IGNORED), or refused by name (NOT_YET: a later version builds it; REFUSED: not planned);
an unknown field is refused too, as OpenAI does. docs/SERVING.md has the table.
Extensions from vLLM that clients and load tests use are honoured: ignore_eos, min_tokens, top_k,
stop_token_ids, repetition_penalty.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from engine.common.formulas import acceptance_rate, mean_acceptance_length
from engine.common.sampling import MAX_REPETITION_PENALTY


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.headers = status, message, param, type_, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": None}}


MAX_STOPS = 4  # OpenAI's limit on stop strings
MAX_STOP_CHARS = 1000  # the engine checks each stop against held-back text per token: keep that cheap
MAX_LOGPROBS = 20  # top alternatives per token: OpenAI chat's top_logprobs limit, vLLM's default max_logprobs
MAX_N = 8  # choices per request (each is its own sequence; also at most the server's slots + waiting queue)
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Fields this server acts on; the rest of a body is sorted by the tables below.
HONOURED = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "stream_options", "stop",
            "stop_token_ids", "ignore_eos", "min_tokens", "n", "logprobs", "echo", "presence_penalty",
            "frequency_penalty", "repetition_penalty", "logit_bias"}
HONOURED_BY_KIND = {"completions": {"prompt"}, "chat": {"messages", "max_completion_tokens", "top_logprobs"}}
# Accepted and ignored: bookkeeping for the caller's side that changes nothing about the answer.
IGNORED = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
           "parallel_tool_calls"}
# Not implemented yet (a later version builds them): refused unless they hold their "off" value.
NOT_YET = {  # field: (is off, what it does, its off value as a client would write it)
}
# Refused: features this server does not have (it returns plain text, one sample per choice).
REFUSED = {  # field: (is off, why)
    "tools": (lambda v: v is None or v == [], "tool calling is not implemented; this server answers in plain text"),
    "tool_choice": (lambda v: v is None or v == "none", "tool calling is not implemented"),
    "functions": (lambda v: v is None or v == [], "function calling is not implemented"),
    "function_call": (lambda v: v is None or v == "none", "function calling is not implemented"),
    "response_format": (lambda v: v is None or v == {"type": "text"},
                        "structured output (json_object, json_schema) is not implemented; only {\"type\": \"text\"}"),
    "best_of": (lambda v: v is None or (_num(v) and v == 1), "best_of other than n (the best of several samples) "
                                                             "is not implemented; leave it out or set it to n"),
    "suffix": (lambda v: v is None or v == "", "insertion (suffix) is not implemented"),
    "min_p": (lambda v: v is None or (_num(v) and v == 0), "min_p sampling is not implemented; use top_p or top_k"),
    "audio": (lambda v: v is None, "audio output is not implemented"),
    "modalities": (lambda v: v is None or v == ["text"], "only text output is implemented"),
    "prediction": (lambda v: v is None, "predicted outputs are not implemented"),
    "reasoning_effort": (lambda v: v is None, "this server does not run reasoning models with an effort setting"),
    "web_search_options": (lambda v: v is None, "web search is not implemented"),
}
# Fields of the other endpoint: refused with a pointer to the right one.
OTHER_KIND = {"completions": {"messages": "/v1/chat/completions takes messages; here send prompt",
                              "max_completion_tokens": "use max_tokens on /v1/completions",
                              "top_logprobs": "on /v1/completions logprobs itself is the number of top tokens"},
              "chat": {"prompt": "/v1/completions takes prompt; here send messages"}}


def check_fields(kind: str, raw: dict) -> None:
    """Refuse, by name, every field we would otherwise drop: not implemented yet, refused, or unknown."""
    for name, v in raw.items():
        if name in HONOURED or name in HONOURED_BY_KIND[kind] or name in IGNORED:
            continue
        if name in NOT_YET:
            off, what, default = NOT_YET[name]
            if not off(v):
                raise APIError(400, f"{name} {_short(v)}: {what} is not implemented yet in this server (a later "
                                    f"version builds it); leave {name} out or send {default}", name)
        elif name == "best_of" and _num(v) and v == raw.get("n", 1):
            continue  # best_of = n: each choice is its best of one
        elif name in REFUSED:
            off, why = REFUSED[name]
            if not off(v):
                raise APIError(400, f"{name} {_short(v)}: {why}; leave {name} out", name)
        elif name in OTHER_KIND[kind]:
            raise APIError(400, f"{name} is not a field of this endpoint: {OTHER_KIND[kind][name]}", name)
        else:
            raise APIError(400, f"unknown field '{name}'; the fields this server takes are listed in "
                                "docs/SERVING.md", name)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # check_fields has refused the rest by name already
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: dict | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    n: int | None = 1
    logprobs: int | bool | None = None  # completions: the number of top tokens; chat: true or false
    echo: bool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict | None = None


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]] | None = None  # [[ids]]: lm-evaluation-harness's


class ChatBody(_Body):
    messages: list[dict] | None = None
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None


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
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    n: int = 1
    logprobs: int | None = None  # top alternatives per new token (0: the token's own logprob only); None: off
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (echo with logprobs)
    echo: str | None = None  # the prompt's text, prepended to each choice's text (echo)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), as SamplingParams takes it
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage so far in every chunk


def parse(kind: str, raw: dict, served_name: str, tokenizer, max_model_len: int, default_max_tokens: int,
          max_n: int = MAX_N) -> Params:
    """Check a request body; APIError(400, ..., param) names the first bad field."""
    if not isinstance(raw, dict):
        raise APIError(400, "the request body must be a JSON object", None)
    check_fields(kind, raw)
    model = CompletionBody if kind == "completions" else ChatBody
    try:
        body = model.model_validate({k: v for k, v in raw.items() if k in model.model_fields})
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else None  # the top-level field, never a union member's tag
        where = ".".join(str(p) for p in err["loc"])
        raise APIError(400, f"{where}: {err['msg']}", field) from None
    if body.model is not None and body.model != served_name:
        raise APIError(400, f"the model '{body.model}' does not exist; this server serves '{served_name}'", "model",
                       "invalid_request_error")
    n = 1 if body.n is None else body.n
    if n < 1:
        raise APIError(400, f"n = {n}: ask for at least one choice", "n")
    if n > max_n:
        raise APIError(400, f"n = {n}: this server gives at most {max_n} choices per request; send n up to {max_n} "
                            "and repeat the request for more", "n")
    logprobs, echo = _logprobs(kind, body)
    stops = _stops(body.stop)
    include_usage, continuous_usage = _include_usage(body.stream_options, body.stream)
    if kind == "chat" and None not in (body.max_tokens, body.max_completion_tokens) \
            and body.max_tokens != body.max_completion_tokens:
        raise APIError(400, f"max_completion_tokens {body.max_completion_tokens} and max_tokens {body.max_tokens} "
                            "disagree; send one of them", "max_completion_tokens")
    vocab = len(tokenizer)
    stop_ids = body.stop_token_ids or []
    if any(not 0 <= t < vocab for t in stop_ids):
        raise APIError(400, f"stop_token_ids must be token ids in [0, {vocab})", "stop_token_ids")
    if kind == "completions":
        ids = _prompt_ids(body.prompt, tokenizer)
    else:
        ids = _chat_ids(body.messages, tokenizer)
    max_tokens = body.max_completion_tokens if kind == "chat" and body.max_completion_tokens is not None \
        else body.max_tokens
    field = "max_completion_tokens" if kind == "chat" and body.max_completion_tokens is not None else "max_tokens"
    room = max_model_len - len(ids)
    if room < (0 if echo and max_tokens == 0 else 1):  # the prompt alone fills the context: the prompt is at fault
        where = "prompt" if kind == "completions" else "messages"
        raise APIError(400, f"the {where} is {len(ids)} tokens; this model's maximum context length is "
                            f"{max_model_len} tokens; shorten the {where}", where)
    if max_tokens is None:
        max_tokens = max(1, min(default_max_tokens, room))
    if max_tokens < 1 and not (max_tokens == 0 and echo and logprobs is not None):
        raise APIError(400, f"{field} is {max_tokens}; ask for at least 1 token (0 only with echo and logprobs: "
                            "the prompt's log probabilities)", field)
    if len(ids) + max_tokens > max_model_len:
        raise APIError(400, f"this model's maximum context length is {max_model_len} tokens; the prompt has "
                            f"{len(ids)} and {field} asks for {max_tokens} more"
                            + (f"; ask for at most {room} tokens" if room >= 1 else "; shorten the prompt"), field)
    t = 1.0 if body.temperature is None else body.temperature
    if not math.isfinite(t) or t < 0 or t > 100:
        raise APIError(400, f"temperature {t} is out of range; use 0 (greedy) or a positive value up to 100",
                       "temperature")
    p = 1.0 if body.top_p is None else body.top_p
    if not math.isfinite(p) or not 0 < p <= 1:
        raise APIError(400, f"top_p {p} is out of range; use a value in (0, 1]", "top_p")
    k = 0 if body.top_k in (None, -1) else body.top_k
    if k < 0:
        raise APIError(400, f"top_k {body.top_k} is out of range; use -1 or 0 (off) or a positive number", "top_k")
    if body.seed is not None and not 0 <= body.seed < 2**63 - (n - 1):  # choice i samples with seed + i
        raise APIError(400, f"seed {body.seed} is out of range; use a whole number in [0, 2**63 - n]", "seed")
    if body.min_tokens < 0 or body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens {body.min_tokens} must be between 0 and max_tokens ({max_tokens})",
                       "min_tokens")
    return Params(ids, int(max_tokens), float(t), float(p), int(k), body.seed, bool(body.stream), include_usage,
                  bool(body.ignore_eos), int(body.min_tokens), served_name, stops, frozenset(stop_ids),
                  n=n, logprobs=logprobs, prompt_logprobs=logprobs if echo else None,
                  echo=_echo_text(body.prompt, ids, tokenizer) if echo else None, **_penalties(body, vocab),
                  continuous_usage=continuous_usage)


def _logprobs(kind: str, body) -> tuple[int | None, bool]:
    """(top alternatives per token or None, echo). Completions: logprobs is 0..MAX_LOGPROBS top tokens;
    chat: logprobs true with top_logprobs 0..MAX_LOGPROBS. Chat has no echo (OpenAI's has none)."""
    if kind == "chat":
        if body.echo:
            raise APIError(400, "echo is not a field of chat completions (OpenAI's chat has no echo); use "
                                "/v1/completions with echo", "echo")
        if body.logprobs not in (None, True, False):
            raise APIError(400, f"logprobs {_short(body.logprobs)}: on chat completions logprobs is true or false, "
                                "with top_logprobs the number of alternatives", "logprobs")
        top = body.top_logprobs or 0
        if not 0 <= top <= MAX_LOGPROBS:
            raise APIError(400, f"top_logprobs {top} is out of range; use 0 to {MAX_LOGPROBS}", "top_logprobs")
        if top and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return (top if body.logprobs else None), False
    lp = body.logprobs
    if lp is True:
        raise APIError(400, f"logprobs true: on /v1/completions logprobs is the number of top tokens, 0 to "
                            f"{MAX_LOGPROBS}", "logprobs")
    if lp is False:
        lp = None
    if lp is not None and not 0 <= lp <= MAX_LOGPROBS:
        raise APIError(400, f"logprobs {lp} is out of range; use 0 to {MAX_LOGPROBS} top tokens", "logprobs")
    return lp, bool(body.echo)


def _echo_text(prompt, ids: list[int], tokenizer) -> str:
    """The prompt as echo returns it: the text sent, or the token ids' text."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else tokenizer.decode(ids)


def _penalties(body, vocab: int) -> dict:
    """presence/frequency penalties in [-2, 2] (OpenAI's), repetition_penalty in (0, 10] (vLLM asks > 0),
    logit_bias: up to MAX_LOGIT_BIAS token id strings (OpenAI's keys) to biases in [-100, 100]."""
    out = {}
    for name, off, lo, hi, fix in (("presence_penalty", 0.0, -2, 2, "a value in [-2, 2]"),
                                   ("frequency_penalty", 0.0, -2, 2, "a value in [-2, 2]"),
                                   ("repetition_penalty", 1.0, 0, MAX_REPETITION_PENALTY,
                                    f"a value above 0, up to {MAX_REPETITION_PENALTY:g} (1 is off)")):
        v = getattr(body, name)
        v = off if v is None else v
        if not math.isfinite(v) or not lo <= v <= hi or (name == "repetition_penalty" and v <= 0):
            raise APIError(400, f"{name} {v} is out of range; use {fix}", name)
        out[name] = float(v)
    bias = body.logit_bias or {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias has {len(bias)} entries; send at most {MAX_LOGIT_BIAS}", "logit_bias")
    pairs = []
    for key, b in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < vocab):
            raise APIError(400, f"logit_bias key {key!r} is not a token id; its keys are token id strings in "
                                f"[0, {vocab}), as \"15\"", "logit_bias")
        if not _num(b) or not math.isfinite(b) or not -100 <= b <= 100:
            raise APIError(400, f"logit_bias[{key!r}] = {_short(b)}: a bias is a number in [-100, 100]", "logit_bias")
        pairs.append((int(key), float(b)))
    if len({t for t, _ in pairs}) < len(pairs):
        raise APIError(400, "logit_bias names a token id twice (as \"7\" and \"07\"); give each id once",
                       "logit_bias")
    out["logit_bias"] = tuple(sorted(pairs))
    return out


def _stops(stop) -> tuple[str, ...]:
    """stop: a string or a list of up to MAX_STOPS non-empty strings."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOPS:
        raise APIError(400, f"stop has {len(stops)} strings; send at most {MAX_STOPS}", "stop")
    for s in stops:
        if not s:
            raise APIError(400, "stop holds an empty string, which would end every answer at once; remove it", "stop")
        if len(s) > MAX_STOP_CHARS:
            raise APIError(400, f"a stop string has {len(s)} characters; send at most {MAX_STOP_CHARS}", "stop")
    return tuple(dict.fromkeys(stops))


def _include_usage(options, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) from stream_options. include_usage is honoured; vLLM's
    continuous_usage_stats puts the usage so far in every chunk too (GuideLLM sends it; it needs
    include_usage, as in vLLM); include_obfuscation is accepted and ignored (we add no padding)."""
    if options is None:
        return False, False
    if not stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
    for key, v in options.items():
        if key not in ("include_usage", "continuous_usage_stats", "include_obfuscation"):
            raise APIError(400, f"stream_options.{key} is not a field this server takes; it takes include_usage "
                                "and continuous_usage_stats", "stream_options")
        if not isinstance(v, bool):
            raise APIError(400, f"stream_options.{key} must be true or false", "stream_options")
    include, continuous = bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))
    if continuous and not include:
        raise APIError(400, "stream_options.continuous_usage_stats needs include_usage true as well",
                       "stream_options")
    return include, continuous


def _prompt_ids(prompt, tokenizer) -> list[int]:
    if prompt is None:
        raise APIError(400, "prompt is required", "prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
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
    try:  # a template may refuse an order of roles (e.g. two user turns in a row) by raising
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    except Exception as e:  # noqa: BLE001  the template's own message says what it wants
        raise APIError(400, f"messages: this model's chat template refused them ({type(e).__name__}: "
                            f"{str(e)[:200]}); check the roles' order and content", "messages") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


# ---------------------------------------------------------------- responses

def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completions" else "chatcmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def spec_metrics(infos: list[dict], policy: str, num_spec_tokens: int) -> dict:
    """vLLM's per-request speculative stats (its --per-request-spec-decode-metrics summary), summed over a
    request's choices, with the policy that ran. A server that is not speculating gives zeros and policy 'off'."""
    rounds = sum(i.get("spec_rounds", 0) for i in infos)
    drafted, accepted = sum(i.get("drafted", 0) for i in infos), sum(i.get("accepted", 0) for i in infos)
    hist = [0] * (num_spec_tokens + 1)
    for i in infos:
        for j, n in enumerate(i.get("accepted_hist", [])[:len(hist)]):
            hist[j] += n
    return {"mean_acceptance_length": mean_acceptance_length(accepted, rounds) or 0.0,  # vLLM's zeros, not None
            "draft_acceptance_rate": acceptance_rate(accepted, drafted) or 0.0, "acceptance_histogram": hist,
            "num_spec_steps": rounds, "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted,
            "num_spec_tokens": num_spec_tokens, "policy": policy}


def full_response(kind: str, rid: str, model: str, choices: list[dict], u: dict) -> dict:
    """choices: {"text", "finish", "logprobs"} per choice, in index order."""
    created = int(time.time())
    if kind == "completions":
        return {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": i, "text": c["text"], "logprobs": c["logprobs"], "finish_reason": c["finish"]}
                            for i, c in enumerate(choices)], "usage": u}
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c["text"]}, "logprobs": c["logprobs"],
                         "finish_reason": c["finish"]} for i, c in enumerate(choices)], "usage": u}


def chunk(kind: str, rid: str, model: str, text: str | None, finish: str | None = None, role: bool = False,
          u: dict | None = None, index: int = 0, logprobs: dict | None = None) -> dict:
    created = int(time.time())
    if u is not None:
        return {"id": rid, "object": "text_completion" if kind == "completions" else "chat.completion.chunk",
                "created": created, "model": model, "choices": [], "usage": u}
    if kind == "completions":
        return {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]}
    delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


# ---------------------------------------------------------------- logprobs in responses

MIN_LOGPROB = -9999.0  # JSON has no -inf: a token of probability 0 reports this (as vLLM does)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: byte -> the character a token string spells it with. Written here:
    transformers' copy lives in an internal module (convert_slow_tokenizer) and has moved between versions."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_OF = {c: b for b, c in _bytes_to_unicode().items()}


class TokenNames:
    """A token's own text and UTF-8 bytes, as logprobs name it (cached per id). Byte-level BPE tokens
    (Qwen, Llama 3, GPT-2) give their exact bytes, so a token holding part of a character says which
    bytes (its text then has U+FFFD, as OpenAI's); other tokenizers give the token decoded alone."""

    def __init__(self, tokenizer):
        self.tok, self.cache = tokenizer, {}

    def __call__(self, tid: int) -> tuple[str, list[int]]:
        got = self.cache.get(tid)
        if got is None:
            piece = self.tok.convert_ids_to_tokens(tid)
            if isinstance(piece, str) and piece and all(c in _BYTE_OF for c in piece):
                raw = bytes(_BYTE_OF[c] for c in piece)
            else:
                raw = self.tok.decode([tid]).encode("utf-8")
            got = self.cache[tid] = (raw.decode("utf-8", errors="replace"), list(raw))
        return got


def _lp(v: float) -> float:
    v = float(v)
    return MIN_LOGPROB if math.isnan(v) else max(v, MIN_LOGPROB)


class ChoiceLogprobs:
    """One choice's logprob entries, with where each token's text starts in the choice's text.

    text_offset[i] is the character where token i's text begins in `text` (after the echoed prompt):
    the decoded text of the tokens before it, by the same incremental detokenizer as the text, so a
    token that only starts a multi-byte character points at that character, and offsets never pass the
    end of the text (tokens of a stop string point at its end). Streaming: `take()` returns the entries
    not sent yet, for the chunk that carries their text."""

    def __init__(self, kind: str, names: TokenNames, tokenizer):
        from engine.infer.tokens import StreamDecoder

        self.kind, self.names, self.tok = kind, names, tokenizer
        self.dec = StreamDecoder(tokenizer)
        self.entries: list = []  # TokenLogprob, or None for the first prompt token
        self.ids: list[int] = []  # the token of each entry
        self.offsets: list[int] = []
        self.base = 0  # characters before the generated text (the echoed prompt)
        self.chars = 0  # the decoded length of the generated tokens so far
        self.sent = 0

    def prompt(self, entries: list, text: str, ids: list[int]) -> None:
        """The echoed prompt's entries (entries None: echo without logprobs, only the text offset base)."""
        from engine.infer.tokens import StreamDecoder

        if entries is not None:
            dec, at = StreamDecoder(self.tok, skip_special_tokens=False), 0
            for t in ids:
                self.offsets.append(min(at, len(text)))
                at += len(dec.push(t))
            self.entries += entries
            self.ids += ids
        self.base = len(text)

    def add(self, entry) -> None:
        self.offsets.append(self.base + self.chars)
        self.chars += len(self.dec.push(entry.token))
        self.entries.append(entry)
        self.ids.append(entry.token)

    def take(self, text_len: int) -> dict | None:
        """The entries not sent yet, as a chunk's logprobs; offsets capped at the text streamed so far."""
        lo, self.sent = self.sent, len(self.entries)
        return self.render(text_len, lo, self.sent) if lo < self.sent else None

    def render(self, text_len: int, lo: int = 0, hi: int | None = None) -> dict:
        """OpenAI's shapes: completions' tokens/token_logprobs/top_logprobs/text_offset, chat's content list."""
        entries = self.entries[lo:hi]
        if self.kind == "chat":
            return {"content": [self._chat(e) for e in entries]}
        names = [self.names(t)[0] for t in self.ids[lo:hi]]
        tops = []
        for e in entries:
            if e is None:
                tops.append(None)
                continue
            top = {}
            for t, v in [*e.top, (e.token, e.logprob)]:  # the chosen token is always there (OpenAI: up to n + 1)
                top.setdefault(self.names(t)[0], _lp(v))
            tops.append(top)
        return {"tokens": names, "token_logprobs": [None if e is None else _lp(e.logprob) for e in entries],
                "top_logprobs": tops, "text_offset": [min(o, text_len) for o in self.offsets[lo:hi]]}

    def _chat(self, e) -> dict:
        text, raw = self.names(e.token)
        return {"token": text, "logprob": _lp(e.logprob), "bytes": raw,
                "top_logprobs": [{"token": self.names(t)[0], "logprob": _lp(v), "bytes": self.names(t)[1]}
                                 for t, v in e.top]}

"""The requests a load test sends: from a workload (ShareGPT chat, HumanEval, ...) or of fixed lengths.

Every length is counted with the client's tokenizer (the lab's converted folder through
transformers' AutoTokenizer), as vLLM's `bench serve` and GuideLLM do, so two servers are asked for
the same work whatever their own tokenizers say. A workload prompt asks for its paired answer's
length (ShareGPT's reference answer tokenized here), capped by `max_output_len`; fixed lengths send
`input_len` tokens (random ids through /v1/completions, or repeated text) and ask for `output_len`.
A multi-turn workload (`multiturn:N[:TURNS]`) gives each conversation's turns in order, each carrying the
conversation so far; the client sends a conversation's turns one after another (client.users).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from engine.common.errors import UserError

FILLER = "The quick brown fox jumps over the lazy dog. "
PROMPT_KINDS = ("random", "text")
MAX_LEN = 131_072


@dataclass(frozen=True)
class Request:
    """One request: a chat message (`messages`) or a completion prompt (`prompt`: text or token ids)."""

    id: str
    prompt_tokens: int  # counted with the client's tokenizer (chat template applied for chat)
    max_tokens: int  # what the request asks for (forced where the server allows it)
    messages: list | None = None
    prompt: str | list[int] | None = None
    reference_tokens: int | None = None  # the workload's paired answer, before the cap
    conversation: str | None = None  # multi-turn: the conversation this turn belongs to (None: single-turn)
    turn: int | None = None  # multi-turn: 0-based; turn k+1's messages begin with turn k's
    category: str | None = None  # the workload's category (chat, code, edit, ..., multiturn); None: fixed lengths

    @property
    def api(self) -> str:
        return "chat" if self.messages is not None else "completions"


# ---------------------------------------------------------------- the client's tokenizer

def tokenizer_folder(name: str) -> Path:
    """A catalog name (default-draft, default) or a folder holding tokenizer.json."""
    p = Path(name).expanduser()
    if p.is_dir():
        return p
    from engine.infer import catalog

    try:
        return Path(catalog.resolve(name))
    except UserError as e:
        raise UserError(f"cannot find the tokenizer '{name}' ({e.problem})",
                        "pass --tokenizer with a catalog name (default-draft, default) or a folder holding "
                        "tokenizer.json; " + (e.fix or "")) from None


@lru_cache(maxsize=4)
def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    folder = tokenizer_folder(name)
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # a folder without a usable tokenizer
        raise UserError(f"cannot load a tokenizer from {folder} ({type(e).__name__}: {str(e)[:120]})",
                        "pass --tokenizer with a folder holding tokenizer.json and tokenizer_config.json") from None


def count_tokens(tokenizer, text: str) -> int:
    """Tokens of generated text, without special tokens (what the server emitted)."""
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


def chat_prompt_tokens(tokenizer, messages: list[dict]) -> int:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return len(ids)


# ---------------------------------------------------------------- building requests

def from_workload(spec: str, tokenizer, max_output_len: int = 256, default_output_len: int = 128,
                  max_model_len: int | None = None) -> list[Request]:
    """One chat request per workload prompt, asking for its reference answer's length (capped)."""
    from engine.measure import workloads

    _check_len(max_output_len, "max output length")
    out = []
    for p in workloads.load(spec):
        messages = [{"role": "user", "content": p.text}]
        n_in = chat_prompt_tokens(tokenizer, messages)
        ref = count_tokens(tokenizer, p.reference_output) if p.reference_output else None
        want = min(max(ref or default_output_len, 1), max_output_len)
        if max_model_len is not None:
            if n_in + 1 > max_model_len:
                continue  # vLLM's benchmark drops prompts that cannot fit, too
            want = min(want, max_model_len - n_in)
        out.append(Request(p.id, n_in, want, messages=messages, reference_tokens=ref, category=p.category))
    if not out:
        raise UserError(f"no prompt of workload '{spec}' fits a context of {max_model_len} tokens",
                        "raise --max-model-len or choose another workload")
    return out


def from_conversations(spec: str, tokenizer, max_output_len: int = 256,
                       max_model_len: int | None = None) -> tuple[list[Request], dict]:
    """Every turn of a `multiturn` workload's conversations, in order, and what was cut.

    Turn k asks for its recorded answer's length (capped, as from_workload). A conversation stops at its
    first turn that cannot fit `max_model_len` (every later turn is longer); one whose first turn cannot
    fit is dropped."""
    from engine.measure import conversations

    _check_len(max_output_len, "max output length")
    count, turns = conversations.parse(spec)
    out, cut, dropped = [], 0, 0
    for conv in conversations.load(spec):
        sent = 0
        for k in range(turns):
            messages = conv.messages(k)
            n_in = chat_prompt_tokens(tokenizer, messages)
            if max_model_len is not None and n_in + 1 > max_model_len:
                break
            ref = count_tokens(tokenizer, conv.exchanges[k].assistant)
            want = min(max(ref, 1), max_output_len)
            if max_model_len is not None:
                want = min(want, max_model_len - n_in)
            out.append(Request(f"{conv.id}.t{k}", n_in, want, messages=messages, reference_tokens=ref,
                               conversation=conv.id, turn=k, category="multiturn"))
            sent += 1
        cut += turns - sent
        dropped += sent == 0
    if not out:
        raise UserError(f"no conversation of workload '{spec}' fits a context of {max_model_len} tokens",
                        "raise --max-model-len or choose another workload")
    return out, {"conversations": count - dropped, "turns_per_conversation": turns,
                 "turns_cut_by_context": cut, "conversations_dropped": dropped}


def fixed_lengths(n: int, input_len: int, output_len: int, tokenizer, kind: str = "random",
                  seed: int = 0) -> list[Request]:
    """`n` completion requests of exactly `input_len` prompt tokens asking for `output_len` tokens.

    random: uniformly drawn ids of ordinary (non-special) tokens, sent as a token-id list, so no
    re-tokenization can change the length; text: FILLER repeated and cut to `input_len` tokens, sent as text.
    """
    _check_len(input_len, "input length")
    _check_len(output_len, "output length")
    if kind not in PROMPT_KINDS:
        raise UserError(f"unknown prompt kind '{kind}'", f"use one of: {', '.join(PROMPT_KINDS)}")
    if kind == "text":
        ids = tokenizer.encode(FILLER * (input_len // 4 + 2), add_special_tokens=False)[:input_len]
        text = tokenizer.decode(ids)
        n_in = len(tokenizer.encode(text, add_special_tokens=False))
        return [Request(f"text-{i}", n_in, output_len, prompt=text) for i in range(n)]
    vocab = _ordinary_ids(tokenizer)
    rng = random.Random(seed)
    return [Request(f"random-{i}", input_len, output_len, prompt=[rng.choice(vocab) for _ in range(input_len)])
            for i in range(n)]


FRESH_IDS = 8  # a token-id prompt's first ids that a fresh copy redraws (its length stays exact)


@lru_cache(maxsize=4)
def _ordinary_ids(tokenizer) -> tuple[int, ...]:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return tuple(i for i in range(min(len(tokenizer), getattr(tokenizer, "vocab_size", len(tokenizer))))
                 if i not in special)


def fresh(reqs: list[Request], tag: str, tokenizer) -> list[Request]:
    """A copy of `reqs` whose every prompt begins differently from any other tag's, so no server can answer
    it from a prompt or prefix cache (llama-server caches each slot's prompt, vLLM caches prefixes).

    Token-id prompts keep their length: their first FRESH_IDS ids are redrawn from (tag, request) as ordinary
    tokens. Text and chat prompts begin with "[tag.i] ", and their token counts are counted again. Every turn
    of a conversation gets its first turn's mark (i of that turn), so the turns still share their prefix."""
    vocab = None
    out = []
    starts: dict[str, int] = {}
    for i, r in enumerate(reqs):
        mark = f"[{tag}.{starts.setdefault(r.conversation, i) if r.conversation is not None else i}] "
        if isinstance(r.prompt, list):
            vocab = vocab or _ordinary_ids(tokenizer)
            rng = random.Random(f"{tag}.{i}")
            k = min(FRESH_IDS, len(r.prompt))
            out.append(Request(f"{r.id}@{tag}", r.prompt_tokens, r.max_tokens,
                               prompt=[rng.choice(vocab) for _ in range(k)] + list(r.prompt[k:]),
                               reference_tokens=r.reference_tokens))
        elif r.messages is not None:
            msgs = [dict(m) for m in r.messages]
            msgs[0]["content"] = mark + msgs[0]["content"]
            out.append(replace(r, id=f"{r.id}@{tag}", prompt_tokens=chat_prompt_tokens(tokenizer, msgs),
                               messages=msgs))
        else:
            text = mark + r.prompt
            out.append(Request(f"{r.id}@{tag}", count_tokens(tokenizer, text), r.max_tokens, prompt=text,
                               reference_tokens=r.reference_tokens))
    return out


def text_of_length(ids: list[int], tokenizer, tries: int = 8) -> str:
    """Text that the tokenizer encodes to exactly len(ids) tokens, for a client that sends only text (GuideLLM).

    Decoded random ids re-encode to more tokens (about 1.5x for the 0.5B's random prompts), which would
    give a text-only client longer prompts than the lab's id prompts. So, as vLLM's random dataset does:
    decode, re-encode, cut or extend the re-encoded ids to the length, and repeat until the length holds.
    """
    n, cur = len(ids), list(ids)
    for _ in range(tries):
        text = tokenizer.decode(cur)
        again = tokenizer.encode(text, add_special_tokens=False)
        if len(again) == n:
            return text
        cur = again[:n] if len(again) > n else again + list(ids[:n - len(again)])
    raise UserError(f"no text of exactly {n} tokens was found for a random prompt in {tries} tries",
                    "use --prompt-kind text, or the lab's own client (--generator lab), which sends token ids")


def _check_len(n, what: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_LEN:
        raise UserError(f"{what} {n} is out of range", f"use 1 to {MAX_LEN} tokens")


def cycle(requests: list[Request], n: int) -> list[Request]:
    """`n` requests, the list repeated in order when it is shorter (ids, and conversations, made unique)."""
    if len(requests) >= n:
        return requests[:n]
    out = []
    for i in range(n):
        r, k = requests[i % len(requests)], i // len(requests)
        out.append(r if not k else replace(r, id=f"{r.id}#{k}",
                                           conversation=r.conversation and f"{r.conversation}#{k}"))
    return out

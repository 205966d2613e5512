"""Calibrated int4 (GPTQ, AWQ): the calibration text, the layer-by-layer pass, and its cache.

A calibrated method reads activations: the model runs the calibration documents one decoder block
at a time; each block's linears are quantized from what their inputs looked like, and the block's
outputs *with the quantized weights* feed the next block (errors of earlier layers are seen by
later ones, as GPTQ's reference implementation and llm-compressor's sequential pipeline do).

The calibration text is workload text the lab never scores: ShareGPT exchanges (first user turn and
its answer), alternately one from the chat selection past position EVAL_HOLDOUT and one whose answer
holds code, from the conversations the selection does not hold. The KLD eval text takes its chat
documents from the front of the chat selection (engine/measure/eval_text.py; tests assert the two
never meet), and pass@1 scores HumanEval, which calibration never reads.

The result is cached once per model weights, method, group size, head choice, calibration set and
algorithm version, as the canonical int4 tensors (engine.ops.formats) in one safetensors file. It is
written to a temporary folder and renamed into place, so an interrupted calibration leaves nothing.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from engine.common import datasets
from engine.common.errors import UserError
from engine.common.paths import cache_dir
from engine.common.vocab import CALIBRATION_VERSIONS
from engine.infer.model import KVCache, Rows, rope_tables
from engine.quant.convert import QuantSpec
from engine.quant.awq import search_scale
from engine.quant.gptq import dequantize_codes, gptq_quantize, group_grid, pack_codes, rtn_codes

__all__ = ["calibration_texts", "calibration_docs", "calibrated", "Calibrated", "calibrate", "CALIBRATION_SET",
           "EVAL_HOLDOUT", "DEFAULT_TOKENS"]

EVAL_HOLDOUT = 256  # chat selection ids [0, 256) are the eval text's and workloads'; calibration reads from 256 on
DEFAULT_TOKENS = 8192  # calibration positions: sized so the 1.5B calibrates within its 20-minute target on 2 cores
MAX_DOC_TOKENS = 512
MIN_DOC_TOKENS = 32
# Named in every cache key and manifest. A coder model's traffic is chat and code: half of each. (Until session 18
# the set was "sharegpt-chat-exchanges", chat only, and GPTQ fitted to it lost 6 points of HumanEval pass@1.)
CALIBRATION_SET = "sharegpt-chat-and-code-exchanges"
VERSIONS = CALIBRATION_VERSIONS


class Cancelled(Exception):
    """The caller asked the calibration to stop; nothing was written."""


def calibration_texts() -> list[tuple[str, str]]:
    """(id, text) of the calibration documents: chat and code exchanges alternated, so any prefix of the set
    (the token budget cuts it) holds both kinds."""
    return [doc for pair in zip(_chat_exchanges(), _code_exchanges()) for doc in pair]


@functools.lru_cache(maxsize=1)  # the two scans read all of ShareGPT: once a process
def _chat_exchanges() -> tuple[tuple[str, str], ...]:
    conv = datasets.sharegpt()
    out = []
    for pid in datasets.selection()["categories"]["chat"]["ids"][EVAL_HOLDOUT:]:
        turn = datasets.first_turn(conv[pid.partition(":")[2]])
        if turn:
            out.append((pid, turn[0] + "\n\n" + turn[1]))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def _code_exchanges() -> tuple[tuple[str, str], ...]:
    """ShareGPT exchanges whose answer holds a fenced code block, from conversations the workload selection
    does not hold, nor any part of one it holds (so no eval or workload text), in the order of their ids' SHA-256."""
    def whole(key: str) -> str:  # ShareGPT cuts a long conversation into parts: abc_0, abc_1, ...
        return key.rpartition("_")[0] or key

    taken = {whole(pid.partition(":")[2]) for cat in datasets.selection()["categories"].values() for pid in cat["ids"]}
    out = []
    for key, conv in datasets.sharegpt().items():
        turn = None if whole(key) in taken else datasets.first_turn(conv)
        if turn and "```" in turn[1]:
            out.append((f"sharegpt:{key}", turn[0] + "\n\n" + turn[1]))
    return tuple(sorted(out, key=lambda d: hashlib.sha256(d[0].encode()).hexdigest()))


def calibration_docs(tokenizer, tokens: int = DEFAULT_TOKENS) -> list[list[int]]:
    """Token ids of calibration documents (each cut at MAX_DOC_TOKENS) until `tokens` positions are met."""
    docs, n = [], 0
    for _, text in calibration_texts():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:min(MAX_DOC_TOKENS, tokens - n)]
        if len(ids) < MIN_DOC_TOKENS:
            continue
        docs.append(ids)
        n += len(ids)
        if n >= tokens:
            return docs
    raise UserError(f"the calibration set holds only {n} of the {tokens} tokens asked for",
                    "ask for fewer calibration tokens")


# ---------------------------------------------------------------- the cache

def weights_key(folder: Path) -> str:
    """A fingerprint of a model folder's weights: config.json, and each safetensors file's size and its
    first and last MiB (cheap, and it changes when the weights do)."""
    h = hashlib.sha256()
    folder = Path(folder)
    cfg = folder / "config.json"
    if cfg.exists():
        h.update(cfg.read_bytes())
    for f in sorted(folder.glob("*.safetensors")):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def entry_dir(name: str, folder: Path, spec: QuantSpec, tokens: int) -> Path:
    what = {"weights": weights_key(folder), "method": base_method(spec), "group_size": spec.group_size,
            "quantize_head": spec.quantize_head, "calibration": CALIBRATION_SET, "tokens": tokens,
            "version": VERSIONS[base_method(spec)]}
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(name))[-60:]
    return cache_dir() / "quantized" / f"{safe}-{base_method(spec)}-g{spec.group_size}-{key}"


def base_method(spec: QuantSpec) -> str:
    """The method whose codes a spec reads: gptq-mixed reads gptq's (and keeps some linears at int8)."""
    return spec.method.removesuffix("-mixed")


@dataclass
class Calibrated:
    """What a calibrated spec loads: int4 codes per linear (by checkpoint names), the float parameters the method
    changed (AWQ's folded norms), the linears kept at int8 (mixed), and the cache entry's manifest."""

    codes: dict
    floats: dict
    keep_int8: set
    manifest: dict
    key: str = ""  # the cache key (entry_dir): the same for every load of the same codes
    fresh: bool = False  # calibrated in this call: the model's block weights were left dequantized (calibrate)

    def facts(self) -> dict:
        """What a record keeps of the calibration that made these codes (EngineSetup cannot say it: the algorithm's
        version and the text are the lab's, not the user's choice), and the codes' own fingerprint: the same key
        calibrated under other float rounding (another CPU, another thread count) gives other codes."""
        m = self.manifest
        keep = ("method", "version", "calibration_set", "calibration_tokens", "calibration_docs")
        return {**{k: m.get(k) for k in keep}, "key": self.key, "codes": m.get("codes_sha256", "")[:16] or None,
                "int8_linears": len(self.keep_int8), **({"tool": m["tool"]} if m.get("tool") else {})}


def _read(path: Path) -> Calibrated | None:
    from safetensors.torch import load_file

    if not all((path / f).exists() for f in ("codes.safetensors", "floats.safetensors", "manifest.json")):
        return None
    t = load_file(str(path / "codes.safetensors"))
    names = {k.rsplit(".", 1)[0] for k in t}
    manifest = json.loads((path / "manifest.json").read_text())
    if "codes_sha256" not in manifest:  # an entry cached before it was kept: hashed once, the manifest replaced
        manifest["codes_sha256"] = _sha256(path / "codes.safetensors")
        tmp = path / f".manifest-{os.getpid()}.json"
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, path / "manifest.json")
    return Calibrated({n: (t[f"{n}.packed"], t[f"{n}.scales"], t[f"{n}.mins"]) for n in names},
                      load_file(str(path / "floats.safetensors")), set(), manifest)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_same_key(path: Path) -> Calibrated | None:
    """The entry of the same key cached under another name: the same weights named by a catalog alias, or by the
    folder's path as the peers' workers load it. The name only labels the folder; the key is what must match."""
    tail = "-".join(path.name.split("-")[-3:])  # ...-g<group>-<key>: the key hashes the method (entry_dir)
    for other in sorted(path.parent.glob(f"*-{tail}")):
        cal = _read(other) if other != path else None
        if cal is not None:
            return cal
    return None


def _write(path: Path, cal: Calibrated, checkpoint: Path | None = None) -> None:
    """Into a temporary folder, then renamed into place: an interrupted write leaves no entry. A checkpoint folder
    (llm-compressor's) moves in as `checkpoint/`."""
    from safetensors.torch import save_file

    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if checkpoint is not None:
        os.replace(checkpoint, tmp / "checkpoint")
    flat = {f"{n}.{part}": t.contiguous() for n, c in cal.codes.items()
            for part, t in zip(("packed", "scales", "mins"), c)}
    save_file(flat, str(tmp / "codes.safetensors"))
    cal.manifest["codes_sha256"] = _sha256(tmp / "codes.safetensors")
    save_file({n: t.contiguous() for n, t in cal.floats.items()}, str(tmp / "floats.safetensors"))
    (tmp / "manifest.json").write_text(json.dumps(cal.manifest, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def calibrated(name: str, folder: Path, model, spec: QuantSpec, tokenizer, progress=None,
               tokens: int | None = None, should_stop=None) -> Calibrated:
    """What `spec` loads for `model` (fp32, unfused, as built): from the cache, or calibrated once and cached.
    The int8 set is empty unless the method is mixed (mixed_selection)."""
    tokens = tokens or DEFAULT_TOKENS
    path = entry_dir(name, folder, spec, tokens)
    cal = _read(path) or _read_same_key(path)
    say = progress or (lambda s: None)
    if cal is None:
        docs = calibration_docs(tokenizer, tokens)
        t0 = time.perf_counter()
        checkpoint, tool = None, None
        if base_method(spec) == "gptq-llmc":
            codes, checkpoint, tool = _llmc_codes(model, folder, spec, docs, path, say, should_stop)
            errors, floats = {}, {}
        else:
            codes, errors, floats = calibrate(model, spec, docs, say, should_stop)
        cal = Calibrated(codes, floats, set(), {
            "model": str(name), "method": base_method(spec), "group_size": spec.group_size,
            "quantize_head": spec.quantize_head, "calibration_set": CALIBRATION_SET,
            "calibration_tokens": sum(map(len, docs)), "calibration_docs": len(docs),
            "version": VERSIONS[base_method(spec)], "tool": tool,
            "seconds": round(time.perf_counter() - t0, 1), "relative_output_error": errors})
        _write(path, cal, checkpoint)
        cal.fresh = checkpoint is None  # llm-compressor calibrated in its own process: this model is untouched
        say(f"calibrated {spec.label} in {time.perf_counter() - t0:.0f} s; cached in {path}")
    cal.key = path.name.rsplit("-", 1)[1]
    if spec.method.endswith("-mixed"):
        cal.keep_int8 = mixed_selection(cal.manifest["relative_output_error"],
                                        {n: c[0].numel() * 2 for n, c in cal.codes.items()})
        cal.codes = {n: c for n, c in cal.codes.items() if n not in cal.keep_int8}
    return cal


def _llmc_codes(model, folder: Path, spec: QuantSpec, docs, path: Path, say, should_stop):
    """(codes, checkpoint folder, tool versions) of llm-compressor's GPTQ on `folder` (engine/quant/llmc.py), its
    checkpoint written beside the entry-to-be; every linear our GPTQ would quantize must be among its codes."""
    from engine.quant import llmc

    _check_calibratable(model, spec)
    out = path.parent / f".llmc-{path.name}-{os.getpid()}"
    shutil.rmtree(out, ignore_errors=True)
    done = llmc.run_oneshot(folder, docs, spec.group_size, spec.quantize_head, out, say, should_stop)
    if done is None:
        raise Cancelled()
    try:
        codes, words = llmc.read_codes(out)
        want = {f"model.layers.{i}.{lname}" for i, blk in enumerate(model.model.layers)
                for lname in _block_linears(blk)}
        want |= {"lm_head"} if spec.quantize_head else set()
        if set(codes) != want:
            odd = sorted(set(codes) ^ want)
            raise UserError(f"llm-compressor's checkpoint does not quantize the linears the lab's GPTQ does ({odd[0]}"
                            f"{f' and {len(odd) - 1} more' if len(odd) > 1 else ''})",
                            "use int4-gptq (the lab's own) for this model, or load the checkpoint as int4-checkpoint")
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    say(f"llm-compressor {done['tools'].get('llmcompressor')}: {words} in {done['seconds']:.0f} s")
    return codes, out, {**done["tools"], "scheme": words, "seconds": done["seconds"]}


MIXED_BUDGET = 0.25  # int8's extra bytes at most this share of the all-int4 linears' bytes


def mixed_selection(errors: dict[str, float], params: dict[str, int], budget: float = MIXED_BUDGET) -> set[str]:
    """The linears to keep at int8: the largest relative int4 output error per extra byte first, while the
    extra bytes (int8's 8 bits against int4's 4.5 per weight, scales counted) fit `budget` of the int4 bytes."""
    int4 = sum(params.values()) * 4.5 / 8
    extra = {n: params[n] * (8 - 4.5) / 8 for n in params}
    keep, spent = set(), 0.0
    for n in sorted(errors, key=lambda n: errors[n] / extra[n], reverse=True):
        if spent + extra[n] <= budget * int4:
            keep.add(n)
            spent += extra[n]
    return keep


# ---------------------------------------------------------------- the layer-by-layer pass

def _check_calibratable(model, spec: QuantSpec) -> None:
    cfg = model.cfg
    if cfg.num_experts:
        raise UserError(f"{spec.label} is not built for mixture-of-experts models ({cfg.family})",
                        "use int4 (round-to-nearest) for this model")
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and (name.startswith("model.layers") or name == "lm_head") \
                and mod.in_features % spec.group_size:
            raise UserError(f"{spec.label}: layer {name} has {mod.in_features} inputs, not a whole number of "
                            f"groups of {spec.group_size}", "pick a group size that divides it, or int4 (rtn)")


SAMPLE_ROWS = 2048  # AWQ's scale search scores each candidate on this many input rows per layer group


GROUP_ROWS = 8192  # calibration rows per forward pass (the default calibration set is one pass)


class _Seen(Exception):
    """Raised by the hook on a block's last input: the rest of that forward pass is not needed."""


@dataclass
class _DocGroup:
    """Documents that go through each block in one forward pass, each in a slot of its own: the linears take all
    their rows at once (the same bits per row as one document at a time), attention and the hooks go document by
    document. x: their hidden rows at the block being calibrated."""

    rows: Rows
    bounds: list[tuple[int, int]]
    tables: dict
    x: torch.Tensor


def _doc_groups(model, docs: list[list[int]]) -> list[_DocGroup]:
    cfg, groups, cut = model.cfg, [], [[]]
    for ids in docs:  # consecutive documents, up to GROUP_ROWS rows a group
        if cut[-1] and sum(map(len, cut[-1])) + len(ids) > GROUP_ROWS:
            cut.append([])
        cut[-1].append(ids)
    for part in cut:
        rows = Rows.of([(slot, 0, len(ids)) for slot, ids in enumerate(part)], "cpu")
        x = model.model.embed_tokens(torch.tensor([t for ids in part for t in ids], dtype=torch.long)).float()
        if cfg.embed_scale != 1.0:
            x = x * torch.tensor(cfg.embed_scale, dtype=x.dtype)
        groups.append(_DocGroup(rows, [(r0, n) for _, r0, n, _ in rows.segments], rope_tables(cfg, rows), x))
    return groups


class _LayerCache(KVCache):
    """One layer's K/V for a group's documents (a slot each): the pass runs one block at a time, so every layer
    writes and reads the same storage."""

    def __init__(self, cfg, slots: int, capacity: int):
        super().__init__(replace(cfg, num_layers=1), slots, capacity, torch.float32, "cpu")

    def write(self, layer: int, rows, k: torch.Tensor, v: torch.Tensor) -> None:
        super().write(0, rows, k, v)

    def read(self, layer: int, slot: int, k0: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return super().read(0, slot, k0, end)


class _Inputs:
    """What hooks see of each input kind over the calibration rows: the mean of x xᵀ (GPTQ), or the
    per-channel mean of |x| and of x² and a strided sample of rows (AWQ). A forward pass's rows are several
    documents' one after another (`bounds`: each one's first row and count); each document is summed and
    sampled on its own, in order."""

    def __init__(self, full: bool, stride: int = 1, last: str | None = None):
        self.full, self.stride, self.last = full, stride, last
        self.bounds: list[tuple[int, int]] = []  # the documents of the rows hooks see next
        self.sums: dict[str, torch.Tensor] = {}
        self.abs: dict[str, torch.Tensor] = {}
        self.rows: dict[str, int] = {}
        self.sample: dict[str, list[torch.Tensor]] = {}
        self.outputs: dict[str, tuple[float, int]] = {}

    def hook(self, key: str):
        def add(_mod, args):
            rows = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            if key not in self.rows:
                K = rows.shape[1]
                self.sums[key] = torch.zeros(K, K) if self.full else torch.zeros(K)
                self.abs[key], self.rows[key], self.sample[key] = torch.zeros(K), 0, []
            for r0, n in self.bounds:
                x = rows[r0:r0 + n]
                if self.full:
                    _add_gram(self.sums[key], x)
                else:
                    self.sums[key] += (x * x).sum(0)
                    self.abs[key] += x.abs().sum(0)
                    self.sample[key].append(x[::self.stride][:SAMPLE_ROWS])
                self.rows[key] += n
            if key == self.last:  # nothing after this input is needed from this pass
                raise _Seen()
        return add

    def signal_hook(self, name: str):
        """A forward hook summing a linear's squared outputs less its bias: their mean over rows is tr(W H Wᵀ)."""
        def add(mod, _args, out):
            ys = (out if mod.bias is None else out - mod.bias).detach()
            ys = ys.reshape(-1, ys.shape[-1])
            for r0, n in self.bounds:
                y = ys[r0:r0 + n]
                total, rows = self.outputs.get(name, (0.0, 0))
                self.outputs[name] = (total + float(y.float().pow(2).sum(dtype=torch.float64)),
                                      rows + y.numel() // y.shape[-1])
        return add

    def signal(self, name: str) -> float | None:
        total, rows = self.outputs.get(name, (0.0, 0))
        return total / rows if rows else None

    def hessian(self, key: str) -> torch.Tensor:
        s = self.sums[key]
        if self.full:  # _add_gram filled the blocks on and below the diagonal: copy those above from them
            for a in range(0, s.shape[0], GRAM_BLOCK):
                s[a:a + GRAM_BLOCK, a + GRAM_BLOCK:] = s[a + GRAM_BLOCK:, a:a + GRAM_BLOCK].T
        return s / max(1, self.rows[key])

    def energy(self, key: str) -> torch.Tensor:
        """Per-channel mean of x² (the Hessian's diagonal)."""
        return (self.sums[key].diagonal() if self.full else self.sums[key]) / max(1, self.rows[key])

    def abs_mean(self, key: str) -> torch.Tensor:
        return self.abs[key] / max(1, self.rows[key])

    def rows_sample(self, key: str) -> torch.Tensor:
        return torch.cat(self.sample[key])[:SAMPLE_ROWS]


GRAM_BLOCK = 512  # columns per block of _add_gram: down_proj's 8,960 make 18, and 171 of their 324 products


def _add_gram(acc: torch.Tensor, x: torch.Tensor, block: int = GRAM_BLOCK) -> None:
    """acc += xᵀx in the column blocks on and below the diagonal only: a Gram matrix is symmetric, so this is about
    half the multiply-adds of the calibration's largest product (down_proj's input, 8,960 wide)."""
    K = x.shape[1]
    for a in range(0, K, block):
        acc[a:, a:a + block].addmm_(x[:, a:].T, x[:, a:a + block])


def _block_linears(blk) -> dict[str, tuple[str, nn.Linear]]:
    """Linear name in the block -> (the input it reads, the layer); q/k/v share one input, gate/up another."""
    a, m = blk.self_attn, blk.mlp
    return {"self_attn.q_proj": ("attn_in", a.q_proj), "self_attn.k_proj": ("attn_in", a.k_proj),
            "self_attn.v_proj": ("attn_in", a.v_proj), "self_attn.o_proj": ("o_in", a.o_proj),
            "mlp.gate_proj": ("mlp_in", m.gate_proj), "mlp.up_proj": ("mlp_in", m.up_proj),
            "mlp.down_proj": ("down_in", m.down_proj)}


def _relative_error(w: torch.Tensor, dq: torch.Tensor, H: torch.Tensor, signal: float | None = None) -> float:
    """tr(ΔW H ΔWᵀ) / tr(W H Wᵀ): the layer's output error-to-signal on the calibration inputs (H full, or its
    diagonal alone); what mixed precision ranks linears by. `signal`, when the pass measured it, is tr(W H Wᵀ)
    (the mean squared output, _Inputs.signal_hook): one product with H fewer."""
    d, w = w.float() - dq, w.float()
    if H.dim() == 1:
        return float((d * d * H).sum() / (w * w * H).sum().clamp(min=1e-30))
    den = ((w @ H) * w).sum() if signal is None else torch.tensor(signal)
    return float(((d @ H) * d).sum() / den.clamp(min=1e-30))


def _fold(prev: nn.Module, s: torch.Tensor, rows: bool) -> list[tuple[str, nn.Parameter]]:
    """Divide what `prev` outputs by s: a norm's weight (Gemma's 1 + w as a whole), or a linear's rows and bias.
    Returns the float parameters it changed, by attribute."""
    if rows:
        prev.weight.data /= s[:, None]
        if prev.bias is not None:
            prev.bias.data /= s
            return [("bias", prev.bias)]
        return []
    w = prev.weight.data
    prev.weight.data = (1 + w) / s - 1 if getattr(prev, "gemma", False) else w / s
    return [("weight", prev.weight)]


@torch.no_grad()
def calibrate(model, spec: QuantSpec, docs: list[list[int]], say=None, should_stop=None):
    """(codes, errors, floats): {linear name: (packed, scales, mins)} for every block linear (and the head when
    quantized), {linear name: relative output error}, and {parameter name: tensor} of the float parameters the
    method changed (AWQ's folded norms); from one block-by-block pass over `docs`. The block weights are left
    dequantized."""
    say = say or (lambda s: None)
    method = base_method(spec)
    if method not in ("gptq", "awq"):
        raise UserError(f"calibration method {spec.method!r} is not built", "use int4-gptq, int4-awq or int4 (rtn)")
    _check_calibratable(model, spec)
    cfg = model.cfg
    groups = _doc_groups(model, docs)
    cache = _LayerCache(cfg, max(len(g.bounds) for g in groups), max(map(len, docs)))
    stride = max(1, sum(map(len, docs)) // SAMPLE_ROWS)
    codes: dict = {}
    errors: dict[str, float] = {}
    floats: dict[str, torch.Tensor] = {}
    n_layers = len(model.model.layers)
    for i, blk in enumerate(model.model.layers):
        if should_stop and should_stop():
            raise Cancelled()
        say(f"calibrating {spec.label}: layer {i + 1}/{n_layers}")
        # AWQ needs no output of this pass: it ends at down_proj's input (GPTQ sums every linear's output)
        seen = _Inputs(method == "gptq", stride, last=None if method == "gptq" else "down_in")
        linears = _block_linears(blk)
        handles = [lin.register_forward_pre_hook(seen.hook(key)) for key, lin in
                   {k: lin for k, lin in linears.values()}.items()]
        if seen.full:
            handles += [lin.register_forward_hook(seen.signal_hook(f"model.layers.{i}.{lname}"))
                        for lname, (_, lin) in linears.items()]
        for g in groups:
            seen.bounds = g.bounds
            try:
                blk(g.x, *g.tables[cfg.ropes[i]], cache, g.rows)
            except _Seen:
                pass
        for h in handles:
            h.remove()
        scale = _awq_block(blk, i, seen, spec, floats) if method == "awq" else {}
        by_input: dict[str, list[tuple[str, nn.Linear]]] = {}
        for lname, (key, lin) in linears.items():
            by_input.setdefault(key, []).append((f"model.layers.{i}.{lname}", lin))
        for key, group in by_input.items():  # linears reading one input are quantized as one stack of rows (exact:
            w = torch.cat([lin.weight.data for _, lin in group])  # rows are independent), one Hessian inverse
            H = _energy_or_hessian(seen, key, scale.get(key))
            (packed, scales, mins), dq = _quantize(w, H, seen.full, spec)
            r0 = 0
            for name, lin in group:
                r1 = r0 + lin.weight.shape[0]
                codes[name] = (packed[r0:r1].contiguous(), scales[r0:r1].contiguous(), mins[r0:r1].contiguous())
                errors[name] = _relative_error(lin.weight.data, dq[r0:r1], H, seen.signal(name))
                lin.weight.data, r0 = dq[r0:r1].clone(), r1
        for g in groups:
            g.x = blk(g.x, *g.tables[cfg.ropes[i]], cache, g.rows)
    if spec.quantize_head:
        say(f"calibrating {spec.label}: the output head")
        seen = _Inputs(method == "gptq", stride)
        for g in groups:
            seen.bounds = g.bounds
            seen.hook("head_in")(None, (model.model.norm(g.x).float(),))
        head = model.lm_head.weight.data
        s = None
        if method == "awq":  # the final norm feeds only the head: fold there (a tied embedding is not touched)
            s, _ = search_scale([head], seen.rows_sample("head_in"), seen.abs_mean("head_in"), seen.energy("head_in"),
                                spec.group_size)
            for attr, p in _fold(model.model.norm, s, rows=False):
                floats[f"model.norm.{attr}"] = p.data.clone()
            head = head * s[None, :]
        H = _energy_or_hessian(seen, "head_in", s)
        codes["lm_head"], dq = _quantize(head, H, seen.full, spec)
        errors["lm_head"] = _relative_error(head, dq, H)
    return codes, errors, floats


def _awq_block(blk, i: int, seen: _Inputs, spec: QuantSpec, floats: dict) -> dict[str, torch.Tensor]:
    """AWQ's scales for a block's input kinds, folded into what produces each input (the norms before attention
    and MLP, up_proj's rows before down_proj); the scaled linears' weights are multiplied by them in place.
    o_proj's input comes out of attention (no fold that stays exact with grouped KV heads): not scaled."""
    a, m = blk.self_attn, blk.mlp
    mlp_norm = blk.pre_feedforward_layernorm if getattr(blk, "sandwich", False) else blk.post_attention_layernorm
    mlp_norm_name = "pre_feedforward_layernorm" if getattr(blk, "sandwich", False) else "post_attention_layernorm"
    groups = [("attn_in", [a.q_proj, a.k_proj, a.v_proj], blk.input_layernorm, "input_layernorm", False),
              ("mlp_in", [m.gate_proj, m.up_proj], mlp_norm, mlp_norm_name, False),
              ("down_in", [m.down_proj], m.up_proj, "mlp.up_proj", True)]
    out = {}
    for key, lins, prev, prev_name, rows in groups:
        s, _ = search_scale([lin.weight.data for lin in lins], seen.rows_sample(key), seen.abs_mean(key),
                            seen.energy(key), spec.group_size)
        for attr, p in _fold(prev, s, rows):
            floats[f"model.layers.{i}.{prev_name}.{attr}"] = p.data.clone()
        for lin in lins:
            lin.weight.data = lin.weight.data * s[None, :]
        out[key] = s
    return out


def _energy_or_hessian(seen: _Inputs, key: str, s: torch.Tensor | None) -> torch.Tensor:
    """GPTQ's full Hessian, or (AWQ) the per-channel energy of the inputs as scaled by s."""
    if seen.full:
        return seen.hessian(key)
    return seen.energy(key) if s is None else seen.energy(key) / (s * s)


def _quantize(w: torch.Tensor, H: torch.Tensor, full: bool, spec: QuantSpec):
    """(codes, dequantized weight) of w: GPTQ with the full Hessian H, or (AWQ) the searched grid on weights already
    scaled, weighted by the scaled inputs' energy H."""
    if full:
        q, scales, mins = gptq_quantize(w, H, spec.group_size)
    else:
        scales, mins = group_grid(w.float(), spec.group_size, importance=H)
        q = rtn_codes(w, scales, mins)
    return (pack_codes(q), scales, mins), dequantize_codes(q, scales, mins)

"""A submission checked in full before it is queued: each bad value refused by its path in the body.

The path names the field the way a reader finds it in the JSON they sent, e.g.
`work.items[2].setup.precision`. Which field is at fault is found by building the object from
its fields in declaration order: the first prefix of fields that no longer validates names it
(so a self-draft equal to its target blames `draft_precision`, the field that made it so).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from engine.backend.contract import QUALITY_TOKENS
from engine.common.errors import UserError
from engine.common.vocab import RUN_KINDS

MAX_CONFIGS = 500  # one job; a bigger grid is a mistake more often than a plan
MAX_TEXT = 200  # title and client id


class Rejected(UserError):
    """A submission the backend will not queue: what, where (`field`) and the fix."""

    def __init__(self, problem: str, field: str | None, fix: str = ""):
        super().__init__(problem, fix)
        self.field = field


@dataclass
class Work:
    """A job: work items run in order by engine.measure.runner.run_many (our runs, peers each in a fresh process,
    quality scores, model loads, load sweeps). The backend has this one job kind; `kinds` names each item's."""
    items: list
    kinds: list[str]
    record_kind: str = "bench"  # what our runs are stored as
    stream: bool = False  # the first run's tokens streamed to the page

    @property
    def total(self) -> int:
        """The steps the job counts: a record per item (a load sweep's per point), or the load it makes."""
        return sum(getattr(item, "steps", 1) for item in self.items)


@dataclass
class Submission:
    title: str
    client: str | None
    work: Work


def _why(e: BaseException) -> tuple[str, str]:
    if isinstance(e, UserError):
        return e.problem, e.fix
    return f"{type(e).__name__}: {e}", ""


def _first_bad(d: dict, names: list[str], check) -> str | None:
    """The first of `names` (present in d) whose addition to the fields before it makes check() fail."""
    present = [n for n in names if n in d]
    for j, name in enumerate(present):
        try:
            check({k: d[k] for k in present[:j + 1]})
        except Exception:
            return name
    return None


def _refuse_unknown(d, known, where: str, what: str):
    if not isinstance(d, dict):
        raise Rejected(f"{where} must be an object, got {type(d).__name__}", where, f"send the fields of {what}")
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise Rejected(f"unknown field '{unknown[0]}' in {where}", f"{where}.{unknown[0]}",
                       f"{what} fields are: {', '.join(known)}")


def _list(d: dict, key: str, where: str, what: str) -> list:
    v = d.get(key)
    if not isinstance(v, list) or not v:
        raise Rejected(f"{where}.{key} must be a non-empty list of {what}", f"{where}.{key}",
                       f"send at least one {what[:-1]}")
    if len(v) > MAX_CONFIGS:
        raise Rejected(f"{where}.{key} has {len(v)} entries", f"{where}.{key}", f"send at most {MAX_CONFIGS} per job")
    return v


def _checked(cls, d, where: str, what: str, required: tuple = (), flat_setup: bool = True):
    """cls.from_dict(d).validate() for a config holding an EngineSetup (RunConfig, PeerConfig, ServerSpec);
    a Rejected names the field: `where.reps`, `where.setup.precision` (or `where.precision` in the flat form)."""
    from engine.common.setup import EngineSetup

    setup_names = [f.name for f in fields(EngineSetup)]
    names = [f.name for f in fields(cls)]
    _refuse_unknown(d, names + (setup_names if flat_setup else []), where, what)
    for name in required:
        if name not in d:
            raise Rejected(f"{where} has no {name}", f"{where}.{name}", f"{what} needs {name}")
    setup = d.get("setup")
    if setup is not None:
        _refuse_unknown(setup, setup_names, f"{where}.setup", "EngineSetup")
    order = [k for n in names for k in ([n] + [s for s in setup_names if s in d] if n == "setup" else [n])]
    fixed = {k: d[k] for k in required}

    def build(part: dict):
        return cls.from_dict({**fixed, **part}).validate()

    try:
        return build(d)
    except Exception as e:
        problem, fix = _why(e)
        bad = _first_bad(d, order, build)
        if bad == "setup" and isinstance(setup, dict):
            sub = _first_bad(setup, setup_names, lambda s: build({"setup": s}))
            bad = f"setup.{sub}" if sub else "setup"
        raise Rejected(problem, f"{where}.{bad}" if bad else where, fix) from None


def run_config(d, where: str):
    """A measure.RunConfig from its wire dict (RunConfig.to_dict()), validated; Rejected names the field."""
    from engine.measure import RunConfig

    return _checked(RunConfig, d, where, "RunConfig")


def _dataclass_from(cls, d, where: str, what: str):
    """cls(**d).validate() for a flat dataclass (SweepPlan), unknown keys refused, the failing field named."""
    names = [f.name for f in fields(cls)]
    _refuse_unknown(d, names, where, what)

    def build(part: dict):
        return cls(**part).validate()

    try:
        return build(d)
    except Exception as e:
        problem, fix = _why(e)
        bad = _first_bad(d, names, build)
        raise Rejected(problem, f"{where}.{bad}" if bad else where, fix) from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def model_source(name: str, field: str) -> None:
    """A model this backend can load, checked here, where a folder must live (not on the dashboard's machine):
    a catalog name, a registered test model, a Hugging Face folder whose config.json this engine computes
    (read as the loader reads it: an unsupported model_type or field is refused by name), or an org/name hub id
    (downloaded when the run starts). Rejected names the field, the problem and the fix."""
    import socket
    import warnings
    from pathlib import Path

    from engine.infer import catalog
    from engine.infer.model import load_config
    from engine.measure import registered_models

    if name in registered_models() or catalog.canonical_name(name) in catalog.CATALOG:
        return
    folder_fix = ("type the path of a Hugging Face model folder (config.json, *.safetensors and the tokenizer) as "
                  f"the backend's machine sees it, an org/name hub id, or a catalog model "
                  f"({', '.join(sorted(catalog.ALIASES))})")
    p = Path(name).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise Rejected(f"folder {p} has no config.json, so it is not a Hugging Face model folder", field,
                           "point at the folder that holds config.json and *.safetensors (save it with "
                           "model.save_pretrained(folder))")
        with warnings.catch_warnings():  # fields we do not know are warned about (and recorded) when it loads
            warnings.simplefilter("ignore")
            try:
                load_config(p)
            except UserError as e:
                raise Rejected(e.problem, field, e.fix) from None
            except Exception as e:  # not JSON, a field of the wrong type: named, never a traceback
                raise Rejected(f"{p / 'config.json'} cannot be read ({type(e).__name__}: {str(e)[:160]})", field,
                               "use the config.json the model was saved with") from None
        if not any(p.glob("*.safetensors")):
            raise Rejected(f"folder {p} has no *.safetensors weights", field,
                           "save the weights as safetensors beside config.json (model.save_pretrained(folder)); "
                           "pickled .bin weights are never loaded")
        if not any((p / f).is_file() for f in TOKENIZER_FILES):
            raise Rejected(f"folder {p} has no tokenizer ({', '.join(TOKENIZER_FILES)})", field,
                           "save the model's tokenizer into the same folder (tokenizer.save_pretrained(folder))")
        return
    if p.exists():
        raise Rejected(f"{p} is a file, not a model folder", field, folder_fix)
    looks_like_path = name.startswith((".", "/", "~")) or "\\" in name or name.count("/") != 1
    if "/" in name and looks_like_path:
        raise Rejected(f"there is no folder {p} on the backend's machine ({socket.gethostname()})", field, folder_fix)
    if "/" not in name:
        raise Rejected(f"unknown model '{name}'", field, folder_fix)


def _check_models(cfg, where: str) -> None:
    """The run's target and draft model exist for this backend."""
    model_source(cfg.setup.model, f"{where}.setup.model")
    if cfg.setup.draft == "model":
        model_source(cfg.setup.draft_model, f"{where}.setup.draft_model")


def _tokens(d: dict, where: str) -> int:
    tokens = d.get("tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens not in QUALITY_TOKENS:
        raise Rejected(f"tokens must be one of {', '.join(map(str, QUALITY_TOKENS))}, got {tokens!r}",
                       f"{where}.tokens", "send the number of eval tokens as a JSON integer from that list")
    return tokens


def _setup(d: dict, where: str, what: str):
    from engine.common.setup import EngineSetup

    if "setup" not in d:
        raise Rejected(f"a {what} item has no setup", f"{where}.setup", "send the EngineSetup (model, precision, ...)")
    setup = _dataclass_from(EngineSetup, d["setup"], f"{where}.setup", "EngineSetup")
    model_source(setup.model, f"{where}.setup.model")
    return setup


def _run_item(d: dict, where: str):
    cfg = run_config(d, where)
    _check_models(cfg, where)
    return cfg


def _peer_item(d: dict, where: str):
    from engine.peers import PeerConfig

    return _checked(PeerConfig, d, where, "PeerConfig")


def _quality_item(d: dict, where: str):
    from engine.infer.loader import target_spec
    from engine.measure.quality import QualityItem

    _refuse_unknown(d, ["setup", "tokens"], where, "a quality item")
    s = _setup(d, where, "quality")
    return QualityItem(s.model, target_spec(s), _tokens(d, where), s.device)


def _llama_quality_item(d: dict, where: str):
    from engine.peers.quality_worker import LlamaQualityItem

    _refuse_unknown(d, ["model", "tokens"], where, "a llama-quality item")
    model = d.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_TEXT:
        raise Rejected(f"model must be a non-empty model name, got {model!r}", f"{where}.model",
                       "send a catalog model's name, e.g. \"default\"")
    return LlamaQualityItem(model.strip(), _tokens(d, where))


def _load_item(d: dict, where: str):
    from engine.measure.loaded import LoadItem

    _refuse_unknown(d, ["setup"], where, "a load item")
    return LoadItem(_setup(d, where, "load"))


def _load_sweep_item(d: dict, where: str):
    from engine.peers.load_sweep import LoadSweepItem, SweepPlan
    from engine.peers.servers import ServerSpec

    _refuse_unknown(d, ["spec", "plan"], where, "a load-sweep item")
    if "spec" not in d:
        raise Rejected("a load-sweep item has no spec", f"{where}.spec", "send the ServerSpec (system, model, ...)")
    spec = _checked(ServerSpec, d["spec"], f"{where}.spec", "ServerSpec", required=("system",), flat_setup=False)
    plan = _dataclass_from(SweepPlan, d.get("plan", {}), f"{where}.plan", "SweepPlan")
    return LoadSweepItem(spec, plan)


# Each kind of work item is declared here, once: its wire name and the parser that makes the item. The worker
# runs every item through engine.measure.runner.run_many, whatever its kind.
ITEMS = {"run": _run_item, "peer": _peer_item, "quality": _quality_item, "llama-quality": _llama_quality_item,
         "load": _load_item, "load-sweep": _load_sweep_item}
ITEM_KINDS = tuple(ITEMS)


def _item(d, where: str):
    """(kind, work item) from one entry of work.items; Rejected names the field."""
    if not isinstance(d, dict):
        raise Rejected(f"{where} must be an object, got {type(d).__name__}", where,
                       f"send {{\"kind\": one of {', '.join(ITEM_KINDS)}, ...}}")
    kind = d.get("kind")
    if kind not in ITEMS:
        raise Rejected(f"unknown work item kind {kind!r}", f"{where}.kind", f"use one of: {', '.join(ITEM_KINDS)}")
    return kind, ITEMS[kind]({k: v for k, v in d.items() if k != "kind"}, where)


def work(w) -> Work:
    """The `work` of a submission: {"items": [{"kind": ..., ...}, ...], "record_kind": ..., "stream": ...}."""
    if not isinstance(w, dict):
        raise Rejected("work must be an object with a list of items", "work",
                       "send {\"items\": [{\"kind\": \"run\", \"setup\": {...}}, ...]}")
    if "kind" in w:  # the job kinds of old clients (runs, load-sweep, ...) are item kinds now
        raise Rejected("work has no kind: a job is a list of work items", "work.kind",
                       f"send {{\"items\": [...]}}, each item with its kind ({', '.join(ITEM_KINDS)})")
    _refuse_unknown(w, ["items", "record_kind", "stream"], "work", "a job")
    record_kind = w.get("record_kind", "bench")
    if record_kind not in RUN_KINDS:
        raise Rejected(f"unknown record kind {record_kind!r}", "work.record_kind",
                       f"use one of: {', '.join(RUN_KINDS)}")
    stream = w.get("stream", False)
    if not isinstance(stream, bool):
        raise Rejected(f"stream must be true or false, got {stream!r}", "work.stream", "send a JSON boolean")
    parsed = [_item(d, f"work.items[{i}]") for i, d in enumerate(_list(w, "items", "work", "work items"))]
    kinds = [k for k, _ in parsed]
    if stream and kinds[0] != "run":
        raise Rejected(f"only a run streams its tokens; the first item is a {kinds[0]}", "work.stream",
                       "put the run to stream first, or send stream: false")
    if stream and "peer" in kinds:
        raise Rejected("a streamed run cannot have peers beside it", f"work.items[{kinds.index('peer')}]",
                       "send the peers as their own job")
    return Work([item for _, item in parsed], kinds, record_kind, stream)


def submission(body) -> Submission:
    """The POST /v1/jobs body, checked in full (every config validated) before anything is queued."""
    _refuse_unknown(body, ["title", "client", "work"], "the body", "a job submission")
    title = body.get("title", "")
    if not isinstance(title, str) or not title.strip() or len(title) > MAX_TEXT:
        raise Rejected("title must be a non-empty string", "title", f"name the job in 1 to {MAX_TEXT} characters")
    client = body.get("client")
    if client is not None and (not isinstance(client, str) or len(client) > MAX_TEXT):
        raise Rejected("client must be a string (a tab or session id)", "client",
                       f"send 1 to {MAX_TEXT} characters or null")
    return Submission(title.strip(), client, work(body.get("work")))

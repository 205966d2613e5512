"""A submission checked in full before it is queued: each bad value refused by its path in the body.

The path names the field the way a reader finds it in the JSON they sent, e.g.
`work.configs[2].setup.precision`. Which field is at fault is found by building the object from
its fields in declaration order: the first prefix of fields that no longer validates names it
(so a self-draft equal to its target blames `draft_precision`, the field that made it so).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

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
class RunsWork:
    """Our runs, then peers beside them (each in a fresh process), in one job: one list of work items."""
    configs: list  # measure.RunConfig
    record_kind: str = "bench"
    stream: bool = False
    peers: list = field(default_factory=list)  # peers.PeerConfig
    kind: ClassVar[str] = "runs"

    @property
    def total(self) -> int:
        return len(self.configs) + len(self.peers)


@dataclass
class LoadSweepWork:
    specs: list  # peers.ServerSpec
    plan: object  # peers.load_sweep.SweepPlan
    kind: ClassVar[str] = "load-sweep"

    @property
    def total(self) -> int:
        return len(self.specs) * self.plan.points_per_configuration()


@dataclass
class LoadWork:
    """Load `setup`'s target into the backend's pool (kept for later jobs); its facts are the job's result."""
    setup: object  # common.setup.EngineSetup
    kind: ClassVar[str] = "load"

    @property
    def total(self) -> int:
        return 1


@dataclass
class QualityWork:
    """Our engine's `setup` (its target: model and precision) scored against fp32 on `tokens` eval tokens."""
    setup: object  # common.setup.EngineSetup
    tokens: int
    kind: ClassVar[str] = "quality"

    @property
    def total(self) -> int:
        return 1


@dataclass
class LlamaQualityWork:
    """llama.cpp's own Q4_K_M of `model` scored against our fp32 reference on `tokens` eval tokens."""
    model: str
    tokens: int
    kind: ClassVar[str] = "llama-quality"

    @property
    def total(self) -> int:
        return 1


@dataclass
class Submission:
    title: str
    client: str | None
    work: RunsWork | LoadSweepWork | LoadWork | QualityWork | LlamaQualityWork


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


def _check_models(cfgs: list, where: str) -> None:
    """Each config's target and draft model exist for this backend (each name checked once per job)."""
    seen: set = set()
    for i, c in enumerate(cfgs):
        names = [("model", c.setup.model)] + ([("draft_model", c.setup.draft_model)] if c.setup.draft == "model"
                                             else [])
        for key, name in names:
            if name not in seen:
                model_source(name, f"{where}[{i}].setup.{key}")
                seen.add(name)


def _runs(w: dict) -> RunsWork:
    _refuse_unknown(w, ["kind", "configs", "record_kind", "stream", "peers"], "work", "a runs job")
    kind = w.get("record_kind", "bench")
    if kind not in RUN_KINDS:
        raise Rejected(f"unknown record kind {kind!r}", "work.record_kind", f"use one of: {', '.join(RUN_KINDS)}")
    stream = w.get("stream", False)
    if not isinstance(stream, bool):
        raise Rejected(f"stream must be true or false, got {stream!r}", "work.stream", "send a JSON boolean")
    peers = _peer_configs(w) if "peers" in w else []
    if peers and w.get("configs", []) == []:  # peers alone: no runs of ours beside them
        cfgs = []
    else:
        cfgs = [run_config(c, f"work.configs[{i}]") for i, c in enumerate(_list(w, "configs", "work", "RunConfigs"))]
    _check_models(cfgs, "work.configs")
    if stream and peers:
        raise Rejected("a streamed run cannot have peers beside it", "work.peers", "send the peers as their own job")
    return RunsWork(cfgs, kind, stream, peers)


def _peer_configs(w: dict) -> list:
    from engine.peers import PeerConfig

    return [_checked(PeerConfig, c, f"work.peers[{i}]", "PeerConfig")
            for i, c in enumerate(_list(w, "peers", "work", "PeerConfigs"))]


def _load_sweep(w: dict) -> LoadSweepWork:
    from engine.peers.load_sweep import SweepPlan
    from engine.peers.servers import ServerSpec

    _refuse_unknown(w, ["kind", "specs", "plan"], "work", "a load-sweep job")
    specs = [_checked(ServerSpec, s, f"work.specs[{i}]", "ServerSpec", required=("system",), flat_setup=False)
             for i, s in enumerate(_list(w, "specs", "work", "ServerSpecs"))]
    plan = _dataclass_from(SweepPlan, w.get("plan", {}), "work.plan", "SweepPlan")
    return LoadSweepWork(specs, plan)


def _tokens(w: dict) -> int:
    tokens = w.get("tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens not in QUALITY_TOKENS:
        raise Rejected(f"tokens must be one of {', '.join(map(str, QUALITY_TOKENS))}, got {tokens!r}", "work.tokens",
                       "send the number of eval tokens as a JSON integer from that list")
    return tokens


def _setup(w: dict, what: str):
    from engine.common.setup import EngineSetup

    if "setup" not in w:
        raise Rejected(f"a {what} job has no setup", "work.setup", "send the EngineSetup (model, precision, ...)")
    setup = _dataclass_from(EngineSetup, w["setup"], "work.setup", "EngineSetup")
    model_source(setup.model, "work.setup.model")
    return setup


def _load(w: dict) -> LoadWork:
    _refuse_unknown(w, ["kind", "setup"], "work", "a load job")
    return LoadWork(_setup(w, "load"))


def _quality(w: dict) -> QualityWork:
    _refuse_unknown(w, ["kind", "setup", "tokens"], "work", "a quality job")
    return QualityWork(_setup(w, "quality"), _tokens(w))


def _llama_quality(w: dict) -> LlamaQualityWork:
    _refuse_unknown(w, ["kind", "model", "tokens"], "work", "a llama-quality job")
    model = w.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_TEXT:
        raise Rejected(f"model must be a non-empty model name, got {model!r}", "work.model",
                       "send a catalog model's name, e.g. \"default\"")
    return LlamaQualityWork(model.strip(), _tokens(w))


# Each work kind is declared once, on its class; the worker runs it with its JobQueue method of the same name
# (engine/backend/jobs.py: "load-sweep" -> _load_sweep).
PARSERS = {RunsWork: _runs, LoadSweepWork: _load_sweep, LoadWork: _load, QualityWork: _quality,
           LlamaQualityWork: _llama_quality}
WORK_KINDS = tuple(t.kind for t in PARSERS)


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
    w = body.get("work")
    if not isinstance(w, dict):
        raise Rejected("work must be an object with a kind", "work",
                       f"send {{\"kind\": one of {', '.join(WORK_KINDS)}, ...}}")
    kind = w.get("kind")
    parse = next((f for t, f in PARSERS.items() if t.kind == kind), None)
    if parse is None:
        raise Rejected(f"unknown work kind {kind!r}", "work.kind", f"use one of: {', '.join(WORK_KINDS)}")
    work = parse(w)
    return Submission(title.strip(), client, work)

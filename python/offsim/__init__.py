"""offsim from Python: forecast LLM-training step time and memory under host-offload policies.

A scenario is a file path, a dict (the YAML structure) or a YAML string; `set` overrides keys
as `offsim --set` does (a list of "key.path=value" strings or a dict {"key.path": value}).

    import offsim
    report = offsim.run("scenarios/examples/zero-offload-1gpu.yaml",
                        set={"training.micro_batch": 2})
    print(report["step_time_s"], report["hbm_peak_bytes"])
    df = offsim.sweep("scenarios/examples/2b-1xa100-sweep.yaml")   # pandas.DataFrame
    tl = offsim.timeline("scenarios/examples/zero-offload-1gpu.yaml")

Simulations release the GIL: a ThreadPoolExecutor runs scenarios in parallel. Errors are
offsim.Error subclasses (InputError, NotFoundError, LimitError, ...) with the CLI's message and
its file, line, column and key.
"""

import csv
import json
import os
import re
import tempfile

from . import _offsim
from .errors import (CancelledError, Error, InputError, IoError, LimitError, NotFoundError,
                     UnsupportedError)

__version__ = _offsim.version
__all__ = ["Error", "InputError", "NotFoundError", "LimitError", "UnsupportedError",
           "CancelledError", "IoError", "Scenario", "load", "resolve", "run", "sweep", "plan",
           "timeline", "import_config"]


class Scenario:
    """A scenario's text, the name its messages use and the directory relative paths resolve
    against, plus overrides. Build one with offsim.load()."""

    def __init__(self, text, source, base_dir, sets=()):
        self.text = text
        self.source = source
        self.base_dir = base_dir
        self.sets = list(sets)

    def with_set(self, set=None):
        return Scenario(self.text, self.source, self.base_dir, self.sets + _sets(set))

    def __repr__(self):
        return f"offsim.Scenario({self.source!r}, sets={self.sets!r})"


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
_RESERVED = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"}


def _flow(value, top=True):
    """A Python value as YAML flow text. Strings that read the same unquoted are written plain,
    as a person writes them in a scenario file (`layers: all`, `offload: none`)."""
    if isinstance(value, str):
        if top or (_PLAIN.match(value) and value.lower() not in _RESERVED):
            return value
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_flow(v, False)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v, False) for v in value) + "]"
    return json.dumps(value)


def _sets(set):
    if set is None:
        return []
    if isinstance(set, dict):
        return [f"{k}={_flow(v)}" for k, v in set.items()]
    if isinstance(set, str):
        return [set]
    return list(set)


def load(source, set=None):
    """A Scenario from a path (str or os.PathLike to an existing file), a dict or a YAML string."""
    if isinstance(source, Scenario):
        return source.with_set(set)
    if isinstance(source, dict):
        return Scenario(_flow(source, False), "<dict>", os.getcwd(), _sets(set))
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and os.path.isfile(source)):
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise IoError(f"{path}: {e.strerror}") from None
        return Scenario(text, path, os.path.dirname(path) or ".", _sets(set))
    if isinstance(source, str):
        if "\n" not in source and ":" not in source:
            raise NotFoundError(f"{source}: no such file")
        return Scenario(source, "<string>", os.getcwd(), _sets(set))
    raise TypeError(f"offsim: expected a path, a dict, a YAML string or a Scenario, got "
                    f"{type(source).__name__}")


def resolve(source, set=None):
    """The effective scenario as a dict: every field, defaults and overrides applied."""
    s = load(source, set)
    _, as_json = _offsim.resolve(s.text, s.source, s.base_dir, s.sets)
    return json.loads(as_json)


def _limits(max_plan_ops, max_memory, time_limit):
    # The CLI's --max-plan-ops, --max-memory (bytes) and --time-limit (seconds); None: default.
    return dict(max_plan_ops=int(max_plan_ops or 0), max_memory_bytes=int(max_memory or 0),
                time_limit_s=float(time_limit or 0.0))


def run(source, set=None, max_plan_ops=None, max_memory=None, time_limit=None):
    """Simulates one step; returns the report as a dict (the keys of `offsim run --format
    json`). The limits are those of the CLI's --max-plan-ops, --max-memory and --time-limit."""
    s = load(source, set)
    report, _ = _offsim.run(s.text, s.source, s.base_dir, s.sets, False,
                            **_limits(max_plan_ops, max_memory, time_limit))
    return json.loads(report)


def timeline(source, set=None, max_plan_ops=None, max_memory=None, time_limit=None):
    """Simulates one step (in full) and returns its timeline for plotting, as `offsim run
    --timeline-out` writes it, plus "report": "lanes" (names), "ops" (name, kind, category,
    layer, flops, bytes), "spans" ({op, lane, start_ns, end_ns}; op and lane index the lists
    above) and "pools" ({name, capacity_bytes, samples: [[time_ns, bytes_in_use], ...],
    peak_bytes, peak_time_ns, live_at_peak})."""
    s = load(source, set)
    report, trace = _offsim.run(s.text, s.source, s.base_dir, s.sets, True,
                                **_limits(max_plan_ops, max_memory, time_limit))
    out = json.loads(trace)
    out["report"] = json.loads(report)
    return out


def _pandas():
    try:
        import pandas
        return pandas
    except ImportError:
        return None


def _number(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text in ("true", "false"):
        return text == "true"
    return text


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def sweep(source, set=None, jobs=0, as_frame=None, max_plan_ops=None, max_memory=None,
          time_limit=None):
    """Evaluates every point of the scenario's sweep block with the CLI's sweep runner (all
    cores unless `jobs`). Returns a pandas.DataFrame (the columns of `offsim sweep --out x.csv`)
    when pandas is importable and as_frame is not False, else a list of dicts."""
    s = load(source, set)
    with tempfile.TemporaryDirectory(prefix="offsim-sweep-") as tmp:
        out = os.path.join(tmp, "sweep.csv")
        _offsim.sweep(s.text, s.source, s.base_dir, s.sets, out, jobs,
                      **_limits(max_plan_ops, max_memory, time_limit))
        pandas = _pandas() if as_frame is not False else None
        if as_frame and pandas is None:
            raise UnsupportedError("sweep(as_frame=True): pandas is not installed")
        if pandas is not None:
            return pandas.read_csv(out, keep_default_na=False, na_values=[""])
        return _rows(out)


def plan(source, set=None, top=5, exhaustive=False, micro_batches=(), search_recompute=False,
         jobs=0, as_frame=None, search_a2a_overlap=False):
    """The offload policy search (`offsim plan`): the best `top` fitting policies, best first,
    as a DataFrame (or a list of dicts without pandas). `search_a2a_overlap`: also with and
    without the expert-parallel all-to-all overlap (parallelism.moe_a2a_overlap) of an MoE
    model."""
    s = load(source, set)
    rows = json.loads(_offsim.plan(s.text, s.source, s.base_dir, s.sets, top, exhaustive,
                                   list(micro_batches), search_recompute, search_a2a_overlap,
                                   jobs))
    pandas = _pandas() if as_frame is not False else None
    if as_frame and pandas is None:
        raise UnsupportedError("plan(as_frame=True): pandas is not installed")
    return pandas.DataFrame(rows) if pandas is not None else rows


def import_config(framework, files, set=None, gpus=0, strict=False, overrides=()):
    """A framework config (`offsim import --from FRAMEWORK`) as a dict: "yaml" (the scenario
    with its mapping as comments), "scenario" (a dict that offsim.run accepts), and "mapped",
    "unmapped" and "ignored" lists of {key, origin, value, target, reason}."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    r = _offsim.import_config(framework, [os.fspath(f) for f in files], _sets(set),
                              list(overrides), gpus, strict)
    r["scenario"] = json.loads(r.pop("scenario_json"))
    return r

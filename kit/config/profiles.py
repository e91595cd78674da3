"""Profiles: a YAML grid of notebook parameters -> the list of validated grid points.

    description: ...            free text
    notebook: finetune          notebooks/<name>.ipynb runs each point; `auto`: each point the
                                notebook of its kind (`point_notebook`: pretrain, multitask ...)
    skip_missing_tasks: true    a GLUE task found nowhere is skipped with a line, not an error
    figures: [label-quality]    figures the batch draws after its tables (FIGURES:
                                label-quality, cost, gamma; kit.results.report.profile_outputs)
    report: false               no HTML report after the batch (default true:
                                kit.results.report.page writes outputs/reports/<profile>/index.html)
    per_device: 2               points run at once on the device (kit.batch --per-device, which
                                overrides it; default 1: one after another)
    paper: base                 the paper's rows beside the profile's own in its tables: base
                                (Table 2), large, roberta-base, roberta-large (Table 3), auto
                                (each model's table), none (default)
    grid: {task: [RTE, CoLA], method: [bert, ssa-h], seed: 0, ...}   (or a list of grids)
    task_overrides: {RTE: {lr: 2.0e-5}}

Every point is validated by RunConfig before anything runs, so a typo stops the batch in
seconds with one line naming the file and the parameter.

`{outputs}` in a text value is the batch's outputs folder (absolute; `--outputs`): a pretraining
point writes `adapted_dir: "{outputs}/adapted/NAME"` and a later point of the same profile
fine-tunes `model: "{outputs}/adapted/NAME"` (the points run in order; params/tapt-smoke.yaml).

`--only KEY=V1,V2` (kit.batch, kit.slurm, kit.plan, the report; repeatable) keeps the points whose
KEY is one of the values (`only`): the same points, so the same run ids as the whole profile's.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from kit import methods
from kit.config.paths import PROJECT, input_path, outputs_root
from kit.config.run_config import ConfigError, RunConfig
from kit.config.tasks import canonical_task_name

REPO = PROJECT                      # the project folder (kit.config.paths)
PROFILE_KEYS = {"description", "notebook", "grid", "task_overrides", "skip_missing_tasks",
                "figures", "report", "per_device", "paper"}
PAPER_TABLES = ("base", "large", "roberta-base", "roberta-large", "auto", "none")
# the figure kinds a profile's `figures:` may name, listed once: kit.results.report.profile_outputs
# draws each, kit.results.report.page shows each one's notebook (tests/test_views.py checks both)
FIGURES = ("label-quality", "cost", "gamma")


class YamlLoader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` as a string; accept exponent floats without a dot."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."))


def _mapping_once(loader: YamlLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A YAML mapping whose every key is given once: PyYAML keeps the last of two silently, and
    a grid with `lr` twice would run one of them without a word."""
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":     # `<<: *base`: overridden on purpose
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice in one mapping (line {seen[key] + 1} and "
                f"line {key_node.start_mark.line + 1}); keep one", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_once)


OUTPUTS = "{outputs}"               # in a point's text values: the batch's outputs folder


def point_notebook(cfg: RunConfig) -> Path:
    """The notebook of a point's kind: pretrain (masked-LM pretraining), multitask (embert /
    gated), kaggle_csv (a k-fold CSV run), else finetune."""
    kind = methods.get(cfg.method)
    name = ("pretrain" if kind.pretrain else "multitask" if kind.multitask
            else "kaggle_csv" if cfg.task == "csv" and cfg.n_folds else "finetune")
    return REPO / "notebooks" / f"{name}.ipynb"


@dataclass
class Profile:
    name: str
    path: Path
    notebook: Path | None              # None (`notebook: auto`): each point's point_notebook
    points: list[dict]                 # notebook parameters per run
    skip_missing_tasks: bool
    figures: tuple[str, ...] = ()
    report: bool = True                # the HTML report after the batch (kit.results.report.page)
    per_device: int = 1                # points at once on the device (kit.cluster.pool)
    paper: str = "none"                # the paper's rows in its tables (PAPER_TABLES)
    grid_ids: frozenset[str] = frozenset()     # every point's run id, the ones --only left out too

    def notebook_for(self, cfg: RunConfig) -> Path:
        return self.notebook or point_notebook(cfg)

    def varying(self) -> list[str]:
        """The grid's axes with more than one value, in the order the points name them: what
        the profile's tables group on (kit.results.tables.table_sets.profile_tables)."""
        keys = dict.fromkeys(k for p in self.points for k in p)
        return [k for k in keys
                if len({json.dumps(p.get(k), sort_keys=True) for p in self.points}) > 1]


def profile_path(name: str) -> Path:
    """params/<name>.yaml, or a YAML file's path (relative: kit.config.paths.input_path)."""
    path = input_path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    path = REPO / "params" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (REPO / "params").glob("*.yaml")))
        raise ConfigError(f"unknown profile {name!r}: choose one of {known} (files in params/)")
    return path


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    """PyYAML's problem and position in one line: `x.yaml: line 3, column 9: expected ...`."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"{path}: not valid YAML: {where}{problem}" + (f" ({context})" if context else "")


def read_spec(path: Path) -> dict:
    try:
        spec = yaml.load(path.read_text(), Loader=YamlLoader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error(path, err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read it ({err})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a mapping of {', '.join(sorted(PROFILE_KEYS))}, "
                          f"got a {type(spec).__name__}")
    unknown = set(map(str, spec)) - PROFILE_KEYS
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    if unknown & fields:
        raise ConfigError(f"{path}: {', '.join(sorted(unknown & fields))} at the top level: run "
                          "parameters go under `grid:` (e.g. grid: {task: RTE, lr: 1.0e-4})")
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"allowed: {', '.join(sorted(PROFILE_KEYS))}")
    return spec


def _grids(path: Path, spec: dict) -> list[dict]:
    grids = spec.get("grid") or {}
    grids = grids if isinstance(grids, list) else [grids]   # a list of grids: their union
    for grid in grids:
        if not isinstance(grid, dict):
            raise ConfigError(f"{path}: `grid` must be a mapping of parameter: value(s), or a "
                              f"list of such mappings; got {grid!r}")
        for key, value in grid.items():
            if value == []:
                raise ConfigError(f"{path}: grid parameter {key!r} has no values ([]): the "
                                  "grid would have no points; give it at least one")
    overrides = spec.get("task_overrides") or {}
    if not isinstance(overrides, dict) or not all(isinstance(v, dict) for v in overrides.values()):
        raise ConfigError(f"{path}: `task_overrides` must map a task to parameter: value, "
                          "e.g. {RTE: {lr: 2.0e-5}}")
    if any("rerun" in part for part in [*grids, *overrides.values()]):   # batches skip finished
        raise ConfigError(f"{path}: `rerun` is not a profile parameter (a batch skips finished "
                          "points); train one again with ./run_all.sh run ... rerun=true")
    return grids


def _task_key(name) -> str:
    """A task's name as the registry spells it (sst2 / SST-2), else as given."""
    try:
        return canonical_task_name(str(name))
    except ValueError:
        return str(name)


def _overrides_for(overrides: dict, task) -> dict:
    """A task's overrides, whichever spelling the grid and the overrides use (sst2 / SST-2)."""
    if not task:
        return {}
    return next((v for k, v in overrides.items() if _task_key(k) == _task_key(task)), {})


def load_profile(name: str, outputs_dir: str = "outputs", only: list[str] | None = None
                 ) -> Profile:
    """The profile's validated points; `only`: `--only KEY=V1,V2` specs (`only_points`)."""
    path = profile_path(name)
    spec = read_spec(path)
    points, seen = [], set()
    for grid in _grids(path, spec):
        axes = {str(k): v if isinstance(v, list) else [v] for k, v in grid.items()}
        for values in itertools.product(*axes.values()):
            point = dict(zip(axes, values))
            point.update(_overrides_for(spec.get("task_overrides") or {}, point.get("task")))
            point = {k: v.replace(OUTPUTS, str(outputs_root(outputs_dir)))
                     if isinstance(v, str) else v for k, v in point.items()}
            point.update(profile=path.stem, outputs_dir=str(outputs_root(outputs_dir)))
            try:
                run_id = RunConfig.from_dict(point).run_id   # validate every point up front
            except (ConfigError, TypeError) as err:
                raise ConfigError(f"{path}: {err}") from None
            if run_id not in seen:           # grids of a list may overlap
                seen.add(run_id)
                points.append(point)
    name = spec.get("notebook", "finetune")
    notebook = None if name == "auto" else REPO / "notebooks" / f"{name}.ipynb"
    if notebook is not None and not notebook.exists():
        raise ConfigError(f"{path}: notebook {notebook.name} not found in notebooks/")
    figures = spec.get("figures") or []
    figures = tuple(figures if isinstance(figures, list) else [figures])
    for kind in figures:
        if kind not in FIGURES:
            raise ConfigError(f"{path}: unknown figure {kind!r} in `figures:`; choose from "
                              f"{', '.join(FIGURES)}")
    report = spec.get("report", True)
    if not isinstance(report, bool):
        raise ConfigError(f"{path}: `report` must be true or false, got {report!r}")
    per_device = spec.get("per_device", 1)
    if isinstance(per_device, bool) or not isinstance(per_device, int) or per_device < 1:
        raise ConfigError(f"{path}: `per_device` must be a whole number >= 1, got {per_device!r}")
    paper = spec.get("paper", "none")
    if paper not in PAPER_TABLES:
        raise ConfigError(f"{path}: `paper` must be one of {', '.join(PAPER_TABLES)}, got {paper!r}")
    skip = spec.get("skip_missing_tasks", False)
    if not isinstance(skip, bool):
        raise ConfigError(f"{path}: `skip_missing_tasks` must be true or false, got {skip!r}")
    _check_grid_names_something(path, spec)
    _check_overrides_used(path, spec.get("task_overrides") or {}, points)
    return Profile(path.stem, path, notebook, only_points(points, only or [], path), skip,
                   figures, report, per_device, paper, frozenset(seen))


def _spelled(key: str, value) -> str:
    """A grid value as --only compares it: task names in the registry's spelling (sst2 = SST-2)."""
    return _task_key(value) if key == "task" else str(value)


def only_points(points: list[dict], specs: list[str], path: Path | str = "profile") -> list[dict]:
    """The points whose KEY is one of V1,V2 for every `KEY=V1,V2` in `specs`, in grid order
    (the same dicts: the same run ids). A key no point has, or a value no point takes, is one
    ConfigError line naming what the grid has."""
    grid = points
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ConfigError(f"--only {spec!r}: expected KEY=V1,V2 (e.g. --only task=RTE,MRPC)")
        has = list(dict.fromkeys(_spelled(key, p[key]) for p in grid if key in p))
        if not has:
            raise ConfigError(f"--only {spec!r}: no point of {path} sets {key!r}")
        wanted = [_spelled(key, v.strip()) for v in values.split(",") if v.strip()]
        unknown = [v for v in wanted if v not in has]
        if unknown:
            raise ConfigError(f"--only {spec!r}: {path} has no point with {key}="
                              f"{','.join(unknown)} (its values: {', '.join(has)})")
        points = [p for p in points if key in p and _spelled(key, p[key]) in wanted]
    if specs and not points:
        raise ConfigError(f"--only {' --only '.join(specs)}: no point of {path} has all of them")
    return points


def _check_grid_names_something(path: Path, spec: dict) -> None:
    """An empty file, or a grid naming no parameter, would run one default point (the
    synthetic task for 3 epochs) that nobody asked for."""
    grids = spec.get("grid") or {}
    if not any(grids if isinstance(grids, list) else [grids]):
        raise ConfigError(f"{path}: no grid: a profile names its runs under `grid:` (e.g. "
                          "grid: {task: RTE, method: [bert, ssa-h]}); params/smoke.yaml is one")


def _check_overrides_used(path: Path, overrides: dict, points: list[dict]) -> None:
    """Overrides for a task no point has: a typo (STS-B for the grid's SST-2) that would
    leave the points it meant without them."""
    tasks = {p["task"] for p in points if p.get("task")}
    for task in overrides:
        if _task_key(task) not in {_task_key(t) for t in tasks}:
            raise ConfigError(f"{path}: task_overrides names {task!r}, which no grid point has "
                              f"(tasks: {', '.join(sorted(map(str, tasks)))})")


def shard(points: list, spec: str | None) -> list:
    """`i/n` keeps points i, i+n, i+2n ... (0 <= i < n): shards of a grid, no coordinator."""
    if not spec:
        return points
    match = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not match or not int(match[1]) < int(match[2]):
        raise ConfigError(f"--shard {spec!r}: expected i/n with 0 <= i < n, e.g. 0/4")
    return points[int(match[1])::int(match[2])]

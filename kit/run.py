"""One run from the command line, through the same notebook and outputs as a profile's point.

    python -m kit.run task=RTE method=ssa-h seed=0 lr=1e-4
    python -m kit.run --task RTE --method ssa-h --tasks RTE,CoLA ...
    ./run_all.sh run task=RTE method=ssa-h

Any RunConfig field, as `name=value`, `--name value` or `--name=value` (dashes or underscores).
Values are YAML scalars (1e-4, true, 3) for number and yes/no fields, verbatim text for text
fields (so `mixed_precision=no` stays "no"), and comma-separated or YAML lists (`tasks=RTE,CoLA`,
`tasks=[RTE, CoLA]`) for list fields. The point is validated and its data checked first (one
line on error, exit 2), then run by kit.cluster.point.execute: a finished run is reused (one line says
when and at which commit it was trained) unless `rerun=true` (`--rerun`) trains it again, its
old results kept until the new run ends ok (kit.runs.lifecycle's rerun protocol: they come back if
it fails; a stopped rerun says where they wait); a failed run is recorded in its metrics.json
(exit 1), and so is a notebook that failed after its run finished (exit 1). `--notebook NAME` picks another notebook in notebooks/ (default: finetune; multitask for
embert/gated; kaggle_csv for a k-fold CSV run; pretrain for method mlm).
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import yaml

from kit.cluster.kernels import prepare_kernels
from kit.cluster.point import NOTEBOOK_FAILED, execute
from kit.cluster.signals import forwarding_signals
from kit import runs
from kit.models.backbones import ModelError
from kit.config.paths import input_path, kit_commit, outputs_root
from kit.config.run_config import ConfigError, RunConfig, field_types
from kit.config.rules import CHOICES
from kit.config.profiles import REPO, Profile, YamlLoader, point_notebook
from kit.data.readers import DataError
from kit.results.views.run_view import best_epoch_line
from kit.runs import finished_metrics, run_dir_of
from kit.train.preemption import PREEMPTED_EXIT
from kit.train.preflight import preflight
from kit.train.progress import reuse_line

USAGE = "python -m kit.run name=value ... | --name value ... [--notebook NAME]"
OPTIONS = ("notebook",)            # options of this command, not RunConfig fields


def parse_args(argv: list[str]) -> tuple[dict, dict]:
    """`name=value` / `--name value` / `--name=value` tokens -> (RunConfig params, options).
    A `--flag` followed by another option or nothing is `true`."""
    raw, i = {}, 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            if not eq:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if nxt is None or nxt.startswith("--") or ("=" in nxt and _is_name(nxt)):
                    value = "true"
                else:
                    value, i = nxt, i + 1
        elif "=" in token:
            name, _, value = token.partition("=")
        else:
            raise ConfigError(f"argument {token!r}: expected name=value or --name value "
                              f"(usage: {USAGE})")
        name = name.replace("-", "_")
        if name in raw:
            raise ConfigError(f"parameter {name!r} is given twice")
        raw[name] = value
        i += 1
    options = {k: raw.pop(k) for k in OPTIONS if k in raw}
    return {name: parse_value(name, text) for name, text in raw.items()}, options


def _is_name(token: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][\w-]*", token.partition("=")[0]) is not None


def parse_value(name: str, text: str):
    """A command-line value in the type of field `name` (unknown names: the text, for
    RunConfig's did-you-mean): text fields verbatim, lists split on commas or read as YAML,
    everything else a YAML scalar (1e-4 is a float)."""
    hint = field_types().get(name)
    if hint is None or hint is str:
        return text
    if hint == tuple[str, ...]:
        if text.lstrip().startswith("["):
            return _yaml(name, text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return _yaml(name, text)


def _yaml(name: str, text: str):
    try:
        return yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"parameter {name!r}: {text!r} is not a YAML value "
                          f"({str(err).splitlines()[0]})") from None


def notebook_for(cfg: RunConfig, name: str | None) -> Path:
    """The notebook a profile would use for this point (see the module docstring)."""
    if not name:
        return point_notebook(cfg)
    path = REPO / "notebooks" / f"{Path(name).stem}.ipynb"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb")))
        raise ConfigError(f"--notebook {name!r}: not in notebooks/ ({known})")
    return path


def run_point(params: dict, notebook: str | None = None) -> tuple[str, str, RunConfig]:
    """Validate, check the data, run one point; returns (status, detail, config)."""
    params = {**params, "outputs_dir": str(outputs_root(params.get("outputs_dir", "outputs")))}
    cfg = RunConfig.from_dict(params)
    profile = Profile(name=cfg.profile or "run", path=Path("command line"),
                      notebook=notebook_for(cfg, notebook), points=[params],
                      skip_missing_tasks=False)
    if finished_metrics(cfg) is not None and not cfg.rerun:   # before the data check: at once
        return "skipped", "finished earlier", cfg
    preflight(profile, [params])
    if cfg.reuse_labels_from:        # as a batch blocks it: only a run that ended ok vouches
        if (why := runs.blocked_source(input_path(cfg.reuse_labels_from))) is not None:
            return "blocked", why, cfg
    prepare_kernels()
    with forwarding_signals():     # a signal: the run stops with a checkpoint (exit 75)
        status, detail = execute(profile, params)
    return status, detail, cfg


def summary(status: str, detail: str, cfg: RunConfig) -> str:
    """What the terminal shows at the end: status, run folder and best dev metrics."""
    run_dir = run_dir_of(cfg)
    lines = [f"{cfg.run_id}: {status}" + (f" ({detail})" if detail else ""), f"  {run_dir}"]
    metrics = runs.readable_metrics(run_dir)
    if (status in ("ok", "skipped", NOTEBOOK_FAILED) and metrics is not None
            and metrics.get("status") == "ok"):
        lines.append(f"  {best_epoch_line(metrics)}")
        if status == "skipped":
            lines.append(f"  {reuse_line(metrics, kit_commit(), 'rerun=true')}")
    return "\n".join(lines)


def help_text() -> str:
    """Usage and every RunConfig field with its default, choices and help (its field metadata)."""
    rows = []
    for f in dataclasses.fields(RunConfig):
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        extra = f"  one of: {', '.join(CHOICES[f.name])}" if f.name in CHOICES else ""
        note = f"  # {f.metadata['help']}" if f.metadata.get("help") else ""
        rows.append(f"  {f.name} = {json.dumps(default)}{extra}{note}")
    doc = __doc__.strip().splitlines()
    return "\n".join([f"usage: {USAGE}", "", *doc, "", "fields (name = default):", *rows])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text())
        return 0
    try:
        params, options = parse_args(argv)
        status, detail, cfg = run_point(params, options.get("notebook"))
    except (ConfigError, DataError, ModelError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary(status, detail, cfg), flush=True)
    # stopped: a signal before training began (resume by running again); held: another
    # process trains this config
    return {"failed": 1, "held": 1, "blocked": 1, NOTEBOOK_FAILED: 1, "preempted": PREEMPTED_EXIT,
            "stopped": PREEMPTED_EXIT}.get(status, 0)


if __name__ == "__main__":
    sys.exit(main())

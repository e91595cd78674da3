"""A profile's grid as the tasks of a cluster job run it: frozen at submission, cut into chains.

- `frozen(profile)`: the grid as it is now, expanded, as a profile of its own (one grid per point,
  in grid order; description, notebook, figures ... kept). `./run_all.sh slurm` writes it into
  the outputs folder under a name made of its content, and every task reads that file, never the
  live YAML: editing params/X.yaml while tasks wait in the queue, or between two starts of a
  requeued task, moves no point from one task to another.
- `chains(points)`: a point that reads another point's output - the folder a masked-LM point
  writes its adapted model to (`adapted_dir`, params/tapt-smoke.yaml), or its run folder
  (`reuse_labels_from`) - must run after it, in the same task. Chains are the units a shard
  takes whole (`shard_points`); in a grid without such points each point is its own chain, and
  shard i/n is points i, i+n, i+2n ... as kit.config.profiles.shard makes it.
- `stuck(...)`: whether a batch stopped by a signal got further than its last start, which
  decides whether requeueing it helps (kit.batch's exit 75, or 3).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from kit.config.paths import input_path, project_path
from kit.config.profiles import Profile, read_spec, shard
from kit.config.run_config import RunConfig

KEPT = ("description", "notebook", "skip_missing_tasks", "figures", "report", "per_device",
        "paper")
PER_BATCH = ("profile", "outputs_dir")      # set again by load_profile from the file and --outputs


def frozen(profile: Profile) -> tuple[str, str]:
    """(the YAML text, a hash of it) of the profile's grid as it is now. A list value is one
    value (multi-task `tasks`): written as a list of one list, as the profile spells it."""
    spec = read_spec(profile.path)
    grid = [{k: [v] if isinstance(v, list) else v for k, v in p.items() if k not in PER_BATCH}
            for p in profile.points]
    text = (f"# profile {profile.name} ({profile.path}), its grid frozen by ./run_all.sh slurm\n"
            + yaml.safe_dump({**{k: spec[k] for k in KEPT if k in spec}, "grid": grid},
                             sort_keys=False))
    return text, hashlib.sha256(text.encode()).hexdigest()[:12]


def sources(points: list[dict]) -> dict[int, list[int]]:
    """{point: the earlier points whose output it reads}, by index: a point whose text values
    name a folder another point writes (its adapted_dir, or a folder inside it) or another
    point's run folder (a path ending in its run id) reads that point's output."""
    made, ids = {}, {}
    for i, point in enumerate(points):
        cfg = RunConfig.from_dict(point)
        ids[cfg.run_id] = i
        if cfg.adapted_dir:
            made[project_path(cfg.adapted_dir)] = i
    found: dict[int, list[int]] = {}
    for i, point in enumerate(points):
        for value in (v for v in point.values() if isinstance(v, str) and v):
            for j in (writer(value, made), ids.get(Path(value).name)):
                if j is not None and j != i and j not in found.get(i, []):
                    found.setdefault(i, []).append(j)
    return found


def outside_sources(points: list[dict]) -> dict[int, Path]:
    """{point: the run folder it reads saved labels from} for the points whose
    `reuse_labels_from` run is no point of `points` (left out by --only, or run by hand): its
    record, not an outcome in this batch, says whether they may run (kit.cluster.pool)."""
    configs = [RunConfig.from_dict(point) for point in points]
    ids = {cfg.run_id for cfg in configs}
    return {i: input_path(cfg.reuse_labels_from) for i, cfg in enumerate(configs)
            if cfg.reuse_labels_from and Path(cfg.reuse_labels_from).name not in ids}


def chains(points: list[dict]) -> list[list[dict]]:
    """The points in groups that run in one task, each group in grid order and the groups in
    the order of their first points: a point joins the group of every point it reads from
    (`sources`)."""
    group = list(range(len(points)))

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    for i, read in sources(points).items():
        for j in read:
            group[root(i)] = root(j)
    out: dict[int, list[dict]] = {}
    for i, point in enumerate(points):
        out.setdefault(root(i), []).append(point)
    return list(out.values())


def writer(value: str, made: dict[Path, int]) -> int | None:
    """Which point writes the folder `value` names: `made` maps each point's adapted_dir
    (project_path) to the point; a folder inside one counts as written by it."""
    path = project_path(value)
    return next((made[p] for p in (path, *path.parents) if p in made), None)


def shard_points(points: list[dict], spec: str | None) -> list[dict]:
    """`--shard i/n` of a grid: its chains i, i+n, i+2n ... (kit.config.profiles.shard checks
    the spec), their points in grid order."""
    if not spec:
        return points
    mine = {id(p) for chain in shard(chains(points), spec) for p in chain}
    return [p for p in points if id(p) in mine]


def stuck(run_id: str | None, where: dict, step_before: int | None, finished: int) -> str | None:
    """Why rerunning a stopped batch would get no further than this start did (None: it would):
    the run it stopped (`run_id`; `where`: its record's `preempted`, written as it stopped) had
    trained steps but left no checkpoint to resume from, or this start finished no point
    (`finished`) and left the run where the last start had (`step_before`): a time limit
    shorter than resuming takes, say."""
    if where.get("step") and where.get("checkpoint") is None:
        return (f"{run_id} was preempted at step {where['step']} without a checkpoint to resume "
                "from: a rerun starts it over")
    if finished or (where.get("step") or 0) > (step_before or 0):
        return None
    at = (f"; {run_id} is at step {where['step']}, as the last start left it"
          if where.get("step") is not None else "")
    return f"no progress in this start: no point finished{at}; a rerun would stop the same way"


def point_label(fields) -> str:
    """`task=RTE method=ssa-h seed=0 model=minilm`: how a batch's lines name a point, from its
    config (RunConfig.to_dict(), or a run's config.json)."""
    return " ".join(f"{k}={fields[k]}" for k in ("task", "method", "seed", "model"))

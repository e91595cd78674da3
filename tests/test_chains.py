"""A chain stops at its first failure: a point that reads another point's output (SSA labels, an
adapted model) whose source did not finish ok is blocked - a line, a failed record naming its
source, exit 1 - serially and K at once; and reuse_labels_from without labels is an error, in
the pre-flight (no such folder) and in the run (no labels for an epoch), never a probe."""
import contextlib
import json

import numpy as np
import pytest

from kit import batch
from kit.cluster import pool, tally
from kit.config.profiles import Profile
from kit.config.run_config import ConfigError, RunConfig
from kit.methods.epochs import build_epoch
from kit.runs import read_metrics, run_dir_of
from kit.train.finetune import fit
from kit.train.window import NonFiniteLoss
from kit.train.preflight import preflight

from tests.test_ssa import MASK, make_examples, never, settings
from tests.test_train import poison_last_epoch

POINT = {"task": "synthetic", "model": "tiny", "synthetic_size": 32, "epochs": 1}


def chain(tmp_path) -> list[dict]:
    """An ssa-h point, a bert point, and an ssa-co point replaying the ssa-h point's labels."""
    first = {**POINT, "method": "ssa-h", "save_labels": True, "outputs_dir": str(tmp_path)}
    source = run_dir_of(RunConfig.from_dict(first))
    return [first, {**POINT, "method": "bert", "outputs_dir": str(tmp_path)},
            {**POINT, "method": "ssa-co", "reuse_labels_from": str(source),
             "outputs_dir": str(tmp_path)}]


@pytest.mark.parametrize("per_device", [1, 2])
@pytest.mark.parametrize("source", ["failed", "absent"])
def test_a_failed_source_blocks_its_dependent_point(tmp_path, capsys, per_device, source):
    points, ran = chain(tmp_path), []

    def run(point, kernels):             # stand-ins: the source fails, the others end ok
        ran.append(point["method"])
        return ("failed", "NonFiniteLoss: ...") if point["method"] == "ssa-h" else ("ok", "")
    absent = ({RunConfig.from_dict(points[0]).run_id: "RTE: not found"} if source == "absent"
              else {})
    work = pool.Batch(Profile("p", tmp_path / "p.yaml", None, points, False), points, absent, run)
    assert pool.run_all(work, None, per_device=per_device, fresh=False, lock_wait_s=0)
    assert sorted(ran) == sorted(["bert"] + (["ssa-h"] if source == "failed" else []))
    why = {"failed": "failed", "absent": "is absent (task files missing)"}[source]
    label = "task=synthetic method=ssa-h seed=0 model=tiny"
    assert f"[3/3] task=synthetic method=ssa-co seed=0 model=tiny: blocked (source {label} {why}) " \
        in capsys.readouterr().out
    record = read_metrics(run_dir_of(RunConfig.from_dict(points[2])))
    assert record["status"] == "failed" and record["error"] == f"blocked (source {label} {why})"
    assert record["blocked_by"] == RunConfig.from_dict(points[0]).run_id
    assert work.counts["blocked"] == 1 and tally.exit_status(work.counts, work.held) == 1
    assert "1 blocked (a source failed)" in tally.summary(work.profile, work.counts, 0.0)


def test_a_source_held_by_another_batch_holds_its_dependent_too(tmp_path):
    points, ran = chain(tmp_path), []

    def run(point, kernels):
        ran.append(point["method"])
        return ("held", "running in another batch") if point["method"] == "ssa-h" else ("ok", "")
    work = pool.Batch(Profile("p", tmp_path / "p.yaml", None, points, False), points, {}, run)
    assert pool.run_all(work, None, per_device=1, fresh=False, lock_wait_s=0)
    assert ran == ["ssa-h", "bert"] and [i for i, _ in work.held] == [1, 3]
    assert not run_dir_of(RunConfig.from_dict(points[2])).joinpath("metrics.json").exists()


def test_reuse_labels_from_no_such_folder_is_refused_in_the_pre_flight(tmp_path):
    points = chain(tmp_path)
    profile = Profile("p", tmp_path / "p.yaml", None, points, False)
    assert preflight(profile, points) == {}          # its source is a point of the grid
    lone = [{**points[2], "reuse_labels_from": "/no/such/run"}]
    with pytest.raises(ConfigError) as err:
        preflight(profile, lone)
    assert str(err.value) == (f"{tmp_path / 'p.yaml'}: reuse_labels_from: /no/such/run: no such "
                              "run folder, and no point of this grid is that run")


@pytest.mark.parametrize("record, why", [
    (None, "that run's status is unknown (no metrics.json)"),
    ({"status": "failed"}, "that run's status is failed"),
    ({"status": "ok"}, "that run saved no labels for it (save_labels: true, and as many epochs "
                       "as this run)")])
def test_reuse_labels_from_a_run_without_labels_is_an_error_never_a_probe(tmp_path, record, why):
    if record is not None:
        (tmp_path / "metrics.json").write_text(json.dumps(record))
    train = make_examples(20, np.random.default_rng(0), cue_every=2)
    with pytest.raises(ConfigError) as err:
        build_epoch(train, settings(method="ssa-co", reuse_labels_from=str(tmp_path)), 1, never,
                    False, MASK)
    assert str(err.value) == (f"reuse_labels_from: {tmp_path} has no saved SSA labels for epoch 1 "
                              f"({why}); this run would otherwise probe its own labels, another "
                              "experiment than asked")


def test_a_batch_with_a_failed_source_says_blocked_and_exits_1(tmp_path, monkeypatch, capsys):
    """Through kit.batch: the summary counts the blocked point, exit 1 (the points stand-ins)."""
    points = chain(tmp_path)
    profile = tmp_path / "p.yaml"
    profile.write_text(json.dumps({"report": False, "grid": [
        {k: v for k, v in p.items() if k != "outputs_dir"} for p in points]}))
    outcomes = {"ssa-h": ("failed", "NonFiniteLoss: ..."), "bert": ("ok", "")}
    monkeypatch.setattr(batch, "execute", lambda prof, point, *a: outcomes[point["method"]])
    monkeypatch.setattr(batch.profile_outputs, "write", lambda *a, **k: None)
    assert batch.main([str(profile), "--outputs", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert ": blocked (source task=synthetic method=ssa-h seed=0 model=tiny failed) " in out
    assert "1 ok, 0 skipped, 1 failed, 1 blocked (a source failed), 0 absent" in out


# a source with SSA labels for epoch 1 (ssa_start_epoch), saved before its last epoch trains
LABELLED = {**POINT, "epochs": 2}


def source_and_reader(tmp_path) -> tuple[dict, dict]:
    """An ssa-h point saving its labels and an ssa-co point replaying them (by its run folder)."""
    source = {**LABELLED, "method": "ssa-h", "save_labels": True}
    folder = run_dir_of(RunConfig.from_dict({**source, "outputs_dir": str(tmp_path)}))
    return source, {**LABELLED, "method": "ssa-co", "reuse_labels_from": str(folder)}


@pytest.mark.parametrize("source_run", ["failed", "ok", "absent"])
def test_only_the_reader_blocks_on_a_source_outside_the_batch(tmp_path, monkeypatch, capsys,
                                                              source_run):
    """--only leaves the source out of the batch, so its record decides: a source that failed
    in its last epoch (its epoch-1 labels saved) or never ran blocks the reader - a line, a
    failed record naming the source, exit 1, nothing trained; one that ended ok lets it train
    on those labels."""
    source, reader = source_and_reader(tmp_path)
    source_cfg = RunConfig.from_dict({**source, "outputs_dir": str(tmp_path)})
    if source_run != "absent":
        if source_run == "failed":
            poison_last_epoch(monkeypatch)
        with pytest.raises(NonFiniteLoss) if source_run == "failed" else contextlib.nullcontext():
            fit(source_cfg)
        monkeypatch.undo()
        assert (run_dir_of(source_cfg) / "ssa_labels" / "epoch1.safetensors").exists()
    profile = tmp_path / "p.yaml"
    profile.write_text(json.dumps({"report": False, "grid": [source, reader]}))
    trained = []

    def execute(prof, point, *a):        # the point in this process, not in a notebook kernel
        trained.append(point["method"])
        return fit(RunConfig.from_dict(point))["status"], ""
    monkeypatch.setattr(batch, "execute", execute)
    monkeypatch.setattr(batch.profile_outputs, "write", lambda *a, **k: None)
    capsys.readouterr()
    code = batch.main([str(profile), "--outputs", str(tmp_path), "--only", "method=ssa-co"])
    out = capsys.readouterr().out
    record = read_metrics(run_dir_of(RunConfig.from_dict({**reader, "outputs_dir": str(tmp_path)})))
    if source_run == "ok":
        assert code == 0 and trained == ["ssa-co"] and record["status"] == "ok"
        assert record["ssa_labels"][0]["reused"] is True
        return
    line = f"blocked (source {source_cfg.run_id}: {source_run})"
    assert code == 1 and trained == []
    assert f"[1/1] task=synthetic method=ssa-co seed=0 model=tiny: {line} " in out
    assert "0 ok, 0 skipped, 0 failed, 1 blocked (a source failed), 0 absent" in out
    assert record == {**record, "status": "failed", "error": line, "blocked_by": source_cfg.run_id}
    assert sorted(p.name for p in run_dir_of(RunConfig.from_dict(
        {**reader, "outputs_dir": str(tmp_path)})).iterdir()) == [".lock", "metrics.json"]


@pytest.mark.parametrize("files, status", [
    ({"config.json": "{}"}, "unfinished, no metrics.json"),
    ({"metrics.json": '{"status": "preempted", "preempted": {"step": 3}}'},
     "unfinished, preempted"),
    ({"metrics.json": '{"status": "failed", "error": "blocked (x)", "blocked_by": "x"}'},
     "blocked"),
    ({"metrics.json": '{"status": "ok", "best'}, "damaged ({folder}/metrics.json: corrupt JSON "
                                                 "(Unterminated string")])
def test_a_source_outside_the_batch_that_did_not_end_ok_blocks_its_reader(tmp_path, capsys,
                                                                          files, status):
    """Running or killed, preempted, blocked itself, a record that cannot be read: only an ok
    source vouches for its saved labels (kit.runs.blocked_source)."""
    folder = tmp_path / "runs" / "elsewhere"
    (folder / "ssa_labels").mkdir(parents=True)
    (folder / "ssa_labels" / "epoch1.safetensors").write_bytes(b"")
    for name, text in files.items():
        (folder / name).write_text(text)
    status = status.format(folder=folder)
    point = {**LABELLED, "method": "ssa-co", "reuse_labels_from": str(folder),
             "outputs_dir": str(tmp_path)}
    ran = []
    work = pool.Batch(Profile("p", tmp_path / "p.yaml", None, [point], False), [point], {},
                      lambda point, kernels: (ran.append(point), ("ok", ""))[1])
    assert pool.run_all(work, None, per_device=1, fresh=False, lock_wait_s=0)
    out = capsys.readouterr().out
    assert ran == [] and work.counts["blocked"] == 1
    assert f": blocked (source elsewhere: {status}" in out
    record = read_metrics(run_dir_of(RunConfig.from_dict(point)))
    assert record["error"].startswith(f"blocked (source elsewhere: {status}")
    assert record["blocked_by"] == "elsewhere"


def test_one_run_from_the_command_line_is_blocked_by_a_source_that_did_not_end_ok(
        tmp_path, capsys, monkeypatch):
    """`python -m kit.run ... reuse_labels_from=FOLDER` reads the source's record as a batch
    does: a source that failed in its last epoch saved earlier labels, which nothing trains on."""
    from kit import run
    folder = tmp_path / "runs" / "elsewhere"
    (folder / "ssa_labels").mkdir(parents=True)
    (folder / "ssa_labels" / "epoch1.safetensors").write_bytes(b"")
    (folder / "metrics.json").write_text('{"status": "failed", "error": "non-finite loss"}')
    trained = []
    monkeypatch.setattr(run, "execute", lambda *a: trained.append(a) or ("ok", ""))
    monkeypatch.setattr(run, "prepare_kernels", lambda: None)
    point = {**LABELLED, "method": "ssa-co", "reuse_labels_from": str(folder),
             "outputs_dir": str(tmp_path)}
    argv = [f"{k}={v}" for k, v in point.items()]
    assert run.main(argv) == 1 and trained == []
    assert ": blocked (source elsewhere: failed)" in capsys.readouterr().out


def test_a_blocked_rerun_keeps_the_finished_runs_record(tmp_path, capsys):
    """`rerun: true` of a finished point whose source outside the batch failed: blocked, and
    the finished run's metrics.json stays as it was (a block never replaces a finished run)."""
    folder = tmp_path / "runs" / "elsewhere"
    (folder / "ssa_labels").mkdir(parents=True)
    (folder / "metrics.json").write_text('{"status": "failed", "error": "non-finite loss"}')
    point = {**LABELLED, "method": "ssa-co", "reuse_labels_from": str(folder),
             "outputs_dir": str(tmp_path)}
    done = run_dir_of(RunConfig.from_dict(point))
    done.mkdir(parents=True)
    record = json.dumps({"status": "ok", "best_dev": {"score": 0.75}})
    (done / "metrics.json").write_text(record)
    point = {**point, "rerun": True}
    ran = []
    work = pool.Batch(Profile("p", tmp_path / "p.yaml", None, [point], False), [point], {},
                      lambda point, kernels: (ran.append(point), ("ok", ""))[1])
    assert pool.run_all(work, None, per_device=1, fresh=False, lock_wait_s=0)
    assert ran == [] and work.counts["blocked"] == 1
    assert ": blocked (source elsewhere: failed" in capsys.readouterr().out
    assert (done / "metrics.json").read_text() == record

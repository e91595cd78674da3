"""What a person sees of a run: the reuse line of a finished run and rerun (which replaces it
only when the new run ends ok), the notebook's in-place display (nothing on stderr), the log's
lines, and epochs counted from 1 wherever they are shown."""
import dataclasses
import json
import re
import shutil

import pytest
import torch

from kit import io as kio
from kit import runs
from kit.config.profiles import load_profile
from kit.config.run_config import ConfigError, RunConfig
from kit.results.views.run_view import epoch_table, multitask_epoch_table, summary_line
from kit.runs import RunPreempted, run_dir_of
from kit.train import loop, progress
from kit.train.window import NonFiniteLoss
from kit.train.finetune import fit
from run_folders import files, hidden

TINY = dict(task="synthetic", model="tiny", synthetic_size=16, epochs=1, lr=5e-3, batch_size=16,
            save_checkpoints=False, report_to=("none",))
HERE = ("c" * 40, False)                   # a checkout: its commit, and no uncommitted changes


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run's outputs folder (copied by each test that changes it)."""
    outputs = tmp_path_factory.mktemp("finished")
    fit(RunConfig(**TINY, outputs_dir=str(outputs)))
    return outputs


def copy_of(finished, tmp_path) -> RunConfig:
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True)
    return RunConfig(**TINY, outputs_dir=str(tmp_path))


# ---------------------------------------------------------------- reuse and rerun

def test_the_reuse_line_names_when_and_where_and_flags_other_code():
    metrics = {"run_id": "r", "finished_at": "2025-03-04T05:06:07+00:00",
               "environment": {"kit_commit": "a" * 40, "kit_dirty": False}}
    assert progress.reuse_line(metrics, ("a" * 40, False)) == (
        "reused finished run r (trained 2025-03-04 05:06 at commit aaaaaaaa); "
        "rerun=True trains it again")
    dirty = {**metrics, "environment": {"kit_commit": "a" * 40, "kit_dirty": True}}
    assert progress.reuse_line(dirty, ("b" * 40, True), "rerun=true") == (
        "reused finished run r (trained 2025-03-04 05:06 at commit aaaaaaaa); WARNING: the "
        "checkout is now at bbbbbbbb, it was trained with uncommitted changes, the checkout has "
        "uncommitted changes: its numbers may not be this code's; rerun=true trains it again")
    old = {"run_id": "r", "environment": {"kit_commit": None, "kit_dirty": None}}
    assert progress.reuse_line(old, (None, None)) == (
        "reused finished run r (trained earlier outside a git checkout); rerun=True trains it "
        "again")


def test_a_finished_run_is_reused_in_one_line_and_rerun_trains_it_again(finished, tmp_path,
                                                                       monkeypatch, capfd):
    cfg = copy_of(finished, tmp_path)
    before = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    monkeypatch.setattr(loop, "kit_commit", lambda: HERE)
    assert fit(cfg) == before                                    # reused, not trained
    commit = before["environment"]["kit_commit"]
    when = before["finished_at"][:16].replace("T", " ")
    assert capfd.readouterr().err.splitlines() == [
        f"reused finished run {cfg.run_id} (trained {when} at commit {commit[:8]}); WARNING: "
        "the checkout is now at cccccccc" + (", it was trained with uncommitted changes"
                                             if before["environment"]["kit_dirty"] else "")
        + ": its numbers may not be this code's; rerun=True trains it again"]
    inode = (run_dir_of(cfg) / "metrics.json").stat().st_ino
    again = fit(dataclasses.replace(cfg, rerun=True))
    err = capfd.readouterr().err
    assert "reused" not in err and "epoch 1/1: dev accuracy" in err     # trained: the log line
    assert (run_dir_of(cfg) / "metrics.json").stat().st_ino != inode     # a new metrics.json
    # (not its wall_s against the old one's: two runs this small can take the same ms)
    assert again == json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert again["status"] == "ok"
    assert json.loads((run_dir_of(cfg) / "config.json").read_text())["rerun"] is False
    assert hidden(cfg) == []                                 # the old run is gone once ok


def test_a_failed_rerun_puts_the_finished_run_back_and_a_stopped_one_resumes_as_a_rerun(
        finished, tmp_path, monkeypatch):
    import kit.train.finetune as finetune
    cfg = copy_of(finished, tmp_path)
    rerun, before = dataclasses.replace(cfg, rerun=True), files(run_dir_of(cfg))
    target_loss = finetune.target_loss
    monkeypatch.setattr(finetune, "target_loss",
                        lambda *a: torch.tensor(float("nan"), requires_grad=True))
    with pytest.raises(NonFiniteLoss):
        fit(rerun)
    assert files(run_dir_of(cfg)) == before and hidden(cfg) == []    # as it was, byte for byte
    monkeypatch.setattr(finetune, "target_loss", target_loss)
    monkeypatch.setattr(loop, "run", lambda *a: (_ for _ in ()).throw(
        RunPreempted({"signal": "SIGTERM", "epoch": 1, "step": 0})))
    with pytest.raises(RunPreempted):
        fit(rerun)                                   # stopped: the finished run stays aside
    assert hidden(cfg) == [f".{cfg.run_id}.previous"]
    assert runs.read_metrics(run_dir_of(cfg))["status"] == "preempted"
    assert files(runs.runs_root(cfg.outputs_dir) / f".{cfg.run_id}.previous") == before
    monkeypatch.undo()
    resumed = fit(cfg)                      # the next fit, rerun or not, finishes the rerun
    assert resumed["status"] == "ok" and hidden(cfg) == []
    assert files(run_dir_of(cfg))["metrics.json"] != before["metrics.json"]


def test_moves_a_killed_process_left_halfway_are_settled(tmp_path):
    folder, aside = tmp_path / "run", tmp_path / ".run.previous"
    (folder / "sub").mkdir(parents=True)
    for name in ("a", "b", ".lock", "sub/c"):
        (folder / name).write_text(name)
    moving = tmp_path / ".run.previous.moving"       # killed after moving "a" only
    moving.mkdir()
    (folder / "a").rename(moving / "a")
    kio.settle(folder, aside)                        # undone: every file back
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "a", "b", "sub"]
    assert not moving.exists() and not aside.exists()
    kio.set_aside(folder, aside)
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]   # the lock stays
    (folder / "new").write_text("the failed rerun's")
    kio.put_back(folder, aside)
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "a", "b", "sub"]
    assert (folder / "sub" / "c").read_text() == "sub/c" and not aside.exists()


def test_a_profile_that_sets_rerun_is_refused(tmp_path):
    path = tmp_path / "again.yaml"
    path.write_text("grid:\n  task: synthetic\n  rerun: true\n")
    with pytest.raises(ConfigError, match=r"again\.yaml: `rerun` is not a profile parameter "
                                          r"\(a batch skips finished points\)"):
        load_profile(str(path))


# ---------------------------------------------------------------- the notebook's display

class FakeDisplay:
    """IPython.display.display with display_id=True: records what a cell would show."""

    def __init__(self):
        self.shown = []              # [(kind, html or widget)]

    def __call__(self, obj, display_id=None, **_):
        self.shown.append(("display", getattr(obj, "data", obj)))
        return self

    def update(self, obj):
        self.shown.append(("update", obj.data))


def test_a_notebook_shows_one_bar_and_one_epoch_table_and_nothing_on_stderr(tmp_path,
                                                                           monkeypatch, capfd):
    import IPython.display
    import tqdm.notebook
    fake = FakeDisplay()
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", fake)
    monkeypatch.setattr(tqdm.notebook, "display", fake)
    monkeypatch.setattr(progress.CellBar, "shared", None)
    monkeypatch.setattr(progress.EpochTable, "current", None)
    cfg = RunConfig(**{**TINY, "epochs": 2, "seed": 1}, outputs_dir=str(tmp_path))
    metrics = fit(cfg)
    assert capfd.readouterr().err == ""
    kinds = [(kind, type(obj).__name__) for kind, obj in fake.shown]
    assert kinds == [("display", "TqdmHBox"), ("display", "str"), ("update", "str")]
    html = fake.shown[-1][1]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", html, re.S)]
    dev = [e["dev"] for e in metrics["epochs"]]
    assert rows == [[f"{n}/2", f"{e['train_loss']:.4f}", f"{d['accuracy']:.4f}", f"{d['f1']:.4f}",
                     "★" if e["epoch"] == metrics["best_epoch"] else ""]
                    for n, e, d in zip((1, 2), metrics["epochs"], dev)]
    assert f'<div class="ssa-epochs"><b>{cfg.run_id}</b>: 2 of 2 epoch(s) done' in html
    fit(cfg)                                          # the reuse line: plain stdout text
    out = capfd.readouterr()
    assert out.err == "" and out.out.startswith(f"reused finished run {cfg.run_id} (trained ")


def test_log_lines_stay_as_they_were(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "lines")
    record = {"epoch": 0, "dev": {"accuracy": 0.5, "f1": 0.25, "score": 0.5}, "train_loss": 0.7}
    progress.epoch_done(record, RunConfig(epochs=3), best=True)
    progress.epoch_done({**record, "epoch": 1}, RunConfig(epochs=3), best=False)
    assert capsys.readouterr().err.splitlines() == [
        "epoch 1/3: dev accuracy 0.5000, f1 0.2500, train loss 0.7000 (best)",
        "epoch 2/3: dev accuracy 0.5000, f1 0.2500, train loss 0.7000"]


# ---------------------------------------------------------------- epochs counted from 1

def test_epochs_count_from_one_wherever_a_person_reads_them(finished):
    cfg = RunConfig(**TINY, outputs_dir=str(finished))
    metrics = runs.read_metrics(run_dir_of(cfg))
    table = epoch_table({**metrics, "epochs": [*metrics["epochs"],
                                               {**metrics["epochs"][0], "epoch": 1}]})
    assert table.index.tolist() == [1, 2] and table["best"].tolist() == ["★", ""]
    dev = metrics["best_dev"]
    assert summary_line(metrics) == (f"{cfg.run_id} ok: best epoch 1/1, accuracy "
                                     f"{dev['accuracy']:.4f}, f1 {dev['f1']:.4f}")
    mixed = {"epochs": [{"epoch": e, "dev": {"RTE": {"score": 0.5}, "score": 0.5},
                         "train_loss": 0.1, "stage": "joint", "task_batches": {"RTE": 2},
                         "wall_s": 1.0} for e in (0, 1)]}
    assert multitask_epoch_table(mixed).index.tolist() == [1, 2]
    multi = {"run_id": "m", "status": "ok", "best_epoch": 0, "epochs": [{}],
             "best_dev": {"score": 0.5, "RTE/accuracy": 0.5, "CoLA/mcc": 0.5}}
    assert summary_line(multi) == ("m ok: best epoch 1/1, mean score 0.5000, RTE/accuracy "
                                   "0.5000, CoLA/mcc 0.5000")

"""Experiment tracking: TensorBoard scalars of a real (tiny) run, read back with tensorboard's
own event reader; report_to choices; a tracker that is not installed is one line."""
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kit.train import tracking
from kit.config.run_config import ConfigError, RunConfig
from kit.train.finetune import fit

TINY = dict(task="synthetic", model="tiny", synthetic_size=64, epochs=2, lr=5e-3, log_every=1,
            save_checkpoints=False)


def scalars(folder) -> dict[str, list[float]]:
    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_run_writes_its_scalars_to_tensorboard(tmp_path):
    cfg = RunConfig(**TINY, method="ssa-h", profile="p", outputs_dir=str(tmp_path))
    metrics = fit(cfg)
    logged = scalars(tmp_path / "tb" / "p" / cfg.run_id)
    for tag in ("train/loss", "train/loss_target", "train/loss_ssa", "train/lr", "dev/accuracy",
                "dev/score", "ssa/flip_rate", "ssa/share_label1", "train/examples_per_s"):
        assert tag in logged, (tag, sorted(logged))
    assert logged["dev/accuracy"] == pytest.approx([e["dev"]["accuracy"] for e in metrics["epochs"]])
    assert len(logged["train/loss"]) == len(_history_rows(tmp_path, cfg))   # one per log step
    assert logged["ssa/flip_rate"] == pytest.approx([s["flip_rate"] for s in metrics["ssa_labels"]])


def _history_rows(outputs, cfg) -> list[str]:
    return (outputs / "runs" / cfg.run_id / "history.csv").read_text().splitlines()[1:]


def test_report_to_none_writes_nothing(tmp_path):
    fit(RunConfig(**TINY, report_to=("none",), outputs_dir=str(tmp_path)))
    assert not (tmp_path / "tb").exists()


def test_report_to_choices():
    assert tracking.resolve(("auto",)) == ["tensorboard"]
    assert tracking.resolve(("none",)) == [] and tracking.resolve(("auto", "tensorboard")) == [
        "tensorboard"]
    assert RunConfig.from_dict({"report_to": "tensorboard"}).report_to == ("tensorboard",)
    with pytest.raises(ConfigError, match="'report_to': 'tensorbored' is not one of"):
        RunConfig(report_to=("tensorbored",))


def test_a_tracker_that_is_not_installed_is_one_line(monkeypatch):
    monkeypatch.setattr(tracking, "_installed", lambda name: name == "tensorboard")
    with pytest.raises(ConfigError, match=r"report_to': wandb is not installed \(pip install wandb\)"):
        tracking.resolve(("wandb",))

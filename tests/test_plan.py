"""The cost of a grid before it runs (kit.plan, kit.cluster.costs), a profile's subsets
(--only), the paper's rows by the profile's `paper:` key, GLUE found per task, and the disk
pre-flight."""
import json
import re
import shutil
from collections import namedtuple
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kit import plan
from kit.cluster import costs, point_cost
from kit.config.profiles import load_profile, only_points
from kit.config.run_config import ConfigError, RunConfig
from kit.data.pipeline import PROJECT_GLUE, glue_source, sources_line
from kit.data.readers import DataError
from kit.results.tables.paper_results import paper_profile, profile_paper

REPO = Path(__file__).resolve().parents[1]


def ids(points):
    return [RunConfig.from_dict(p).run_id for p in points]


# ------------------------------------------------------------------ --only

def test_only_keeps_the_whole_profiles_points_and_run_ids():
    whole = load_profile("paper-base")
    part = load_profile("paper-base", only=["task=RTE,mrpc"])      # any spelling of a task
    assert len(whole.points) == 180 and len(part.points) == 40
    assert {p["task"] for p in part.points} == {"RTE", "MRPC"}
    assert set(ids(part.points)) < set(ids(whole.points))
    two = load_profile("paper-base", only=["task=RTE", "seed=0,1", "method=ssa-h"])
    assert [(p["task"], p["seed"], p["method"]) for p in two.points] == [
        ("RTE", 0, "ssa-h"), ("RTE", 1, "ssa-h")]


@pytest.mark.parametrize("spec,says", [
    ("task", "expected KEY=V1,V2"),
    ("task=", "expected KEY=V1,V2"),
    ("lr2=1", "no point of"),
    ("task=XYZ", "has no point with task=XYZ (its values: CoLA, SST-2, MRPC"),
])
def test_a_bad_only_is_one_line(spec, says):
    with pytest.raises(ConfigError, match="^--only") as err:
        load_profile("paper-base", only=[spec])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_only_values_that_no_point_has_together_are_refused():
    points = [{"task": "RTE", "method": "bert"}, {"task": "CoLA", "method": "ssa-h"}]
    assert only_points(points, ["method=bert"]) == points[:1]
    with pytest.raises(ConfigError, match="no point of p has all of them"):
        only_points(points, ["task=RTE", "method=ssa-h"], "p")


# ------------------------------------------------------------------ paper: key

def test_the_papers_rows_follow_the_profile_not_its_name(tmp_path):
    copy = tmp_path / "my-table2.yaml"
    shutil.copy(REPO / "params" / "paper-base.yaml", copy)
    assert profile_paper(str(copy)) == "base" and paper_profile(str(copy))
    assert profile_paper("paper-large") == "large" and profile_paper("roberta") == "auto"
    assert profile_paper("glue-small") == "none" and not paper_profile("smoke")
    assert profile_paper(None) == "none" and profile_paper("no-such-profile") == "none"
    spec = yaml.safe_load(copy.read_text())
    copy.write_text(yaml.safe_dump({**spec, "paper": "base-ish"}))
    with pytest.raises(ConfigError, match="`paper` must be one of base, large"):
        load_profile(str(copy))


def test_a_copy_of_paper_base_shows_the_papers_rows(tmp_path):
    from test_paper_outputs import make_run
    from kit.results.frame import collect
    from kit.results.tables import table_sets
    for seed, score in enumerate([0.60, 0.62, 0.61]):
        make_run(tmp_path, f"b{seed}", "p", method="bert", seed=seed, score=score)
    copy = tmp_path / "mine.yaml"
    shutil.copy(REPO / "params" / "paper-base.yaml", copy)
    table = table_sets.results_tables(collect.collect_runs(tmp_path), profile=str(copy))
    assert list(table["Paper layout"].index) == ["BERT-r", "BERT-r (paper)",
                                                 "BERT-r (measured - paper)"]


# ------------------------------------------------------------------ data per task

def test_a_glue_dir_with_only_mrpc_leaves_rte_to_the_projects_copy(tmp_path, monkeypatch):
    (tmp_path / "MRPC").mkdir()
    for split in ("train", "dev"):
        (tmp_path / "MRPC" / f"{split}.tsv").write_text("x\n")
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    assert glue_source("", "MRPC") == tmp_path
    assert glue_source("", "RTE") == PROJECT_GLUE                 # GLUE_DIR lacks it
    assert glue_source("", "QQP") == "hub"                        # nowhere
    assert glue_source(str(tmp_path / "MRPC").rsplit("/", 1)[0], "RTE") == PROJECT_GLUE
    cfgs = [RunConfig(task=t, method=m) for t in ("RTE", "MRPC") for m in ("bert", "ssa-h")]
    assert sources_line(cfgs) == (f"data: RTE from data/glue (the project's copy); MRPC from "
                                  f"{tmp_path}")
    monkeypatch.setenv("GLUE_DIR", str(tmp_path / "nope"))
    with pytest.raises(DataError, match="GLUE_DIR=.*nope: no such folder"):
        glue_source("", "RTE")                                    # named, absent: an error


# ------------------------------------------------------------------ the cost model

def fake_probe(step, length, **_):
    """A probe's numbers made from its step (kit.train.model_probe.step_config) and length: the
    plan's arithmetic, checked exactly."""
    return {"s_per_step": step.batch_size * length / 1000,
            "s_per_eval_batch": step.eval_batch_size / 1000,
            "build_s": 1.0, "peak_memory_bytes": 1000 * length, "model_bytes": 4000,
            "optimizer_bytes": 8000, "device": "cpu", "precision": "no", "steps": 3,
            "checkpoint_s": 0.6}


AROUND = {"once_s": 7.0, "per_point_s": 0.5}       # a batch's overhead, as batch_probe gives it


Facts = namedtuple("Facts", "train_rows dev_rows test_rows")


@pytest.mark.parametrize("method,gamma,budget,steps,extra,evaluated", [
    ("bert", 1.0, "epochs", 3 * 4, 0, 3 * 50),                   # 100 rows / 32 -> 4 a epoch
    ("bert-mask", 1.0, "epochs", 4 + 2 * 7, 200, 3 * 50),        # epochs 2, 3: 200 rows
    ("bert-mask", 1.0, "equal_steps", 3 * 4, 200, 3 * 50),
    ("ssa-h", 2.0, "epochs", 3 * 4, 0, 3 * 50 + 2 * 300),        # probes 100 + 200 variants
])
def test_work_counts_steps_extra_examples_and_evaluated_rows(method, gamma, budget, steps,
                                                             extra, evaluated):
    facts = costs.TaskFacts(100, 50, 0, 20.0, 18.0, 24.0, "files", "x", 0.0, 0)
    cfg = RunConfig(task="RTE", method=method, gamma=gamma, budget=budget, epochs=3,
                    batch_size=32)
    got = costs.work(cfg, facts)
    assert (got.steps, got.extra_rows, got.eval_rows) == (steps, extra, evaluated)
    assert got.probe_rows == evaluated - 3 * 50            # SSA's probing of training rows


@pytest.mark.parametrize("keep,test,kept,peak", [
    (True, 0, 10 + 4100 + 12000, 10 + 4100 + 2 * 12000),
    (False, 0, 10, 10 + 2 * 12000),
    (False, 5, 10, 10 + 4100 + 2 * 12000),            # best, to predict the test set
])
def test_disk_counts_the_checkpoints_a_run_keeps(keep, test, kept, peak):
    facts = costs.TaskFacts(100, 50, test, 20.0, 18.0, 24.0, "files", "x", 0.0, 10)
    got = costs.disk(RunConfig(save_checkpoints=keep), facts, 4000, 8000, 100)
    assert (got.kept, got.peak) == (kept, peak)


def test_the_plan_of_a_profile_part_from_the_files_and_official_counts(monkeypatch):
    monkeypatch.setattr(plan, "tokenizer_of", lambda model: __import__(
        "kit.models.backbones", fromlist=["x"]).load_tokenizer("tiny"))
    monkeypatch.setattr(plan, "saved_bytes", lambda tokenizer: 100)
    profile = load_profile("paper-base", only=["task=RTE,MRPC", "seed=0", "method=bert,ssa-h"])
    result = plan.plan(profile, probe=fake_probe, overhead=AROUND)
    by = {p["label"]: p for p in result["points"]}
    assert list(by) == ["MRPC bert s0", "MRPC ssa-h s0", "RTE bert s0", "RTE ssa-h s0"]
    rte, mrpc = by["RTE bert s0"], by["MRPC bert s0"]
    assert (rte["label"], rte["train_rows"], rte["dev_rows"], rte["test_rows"]) == (
        "RTE bert s0", 2490, 277, 3000)
    assert rte["rows_from"] == "files" and rte["data"] == "data/glue (the project's copy)"
    assert (mrpc["train_rows"], mrpc["dev_rows"], mrpc["test_rows"]) == (3668, 408, 1725)
    assert mrpc["rows_from"] == costs.OFFICIAL and mrpc["tokens"] == 128   # max_length
    assert rte["steps"] == 3 * 78 and rte["epochs"] == 3 and rte["batch_size"] == 32
    # the fake s/step is linear in the length: the line between two classes gives it exactly
    assert rte["train_s"] == pytest.approx(3 * 78 * 32 * rte["tokens"] / 1000, abs=0.2)
    assert rte["eval_s"] == round((3 * 277 + 3000) / 1000, 1) and rte["prepare_s"] >= 1.0
    # `last` each epoch, `best` each epoch (it predicts the test set) at its 4000 / 12000 share
    assert rte["checkpoint_s"] == pytest.approx(3 * 0.6 + 3 * 0.6 / 3) and rte["notebook_s"] == 0.5
    assert rte["seconds"] == pytest.approx(rte["train_s"] + rte["eval_s"] + rte["prepare_s"]
                                           + rte["checkpoint_s"] + 0.5, abs=0.25)
    assert not rte["keeps_checkpoint"] and rte["disk_kept_bytes"] < 200_000   # predictions only
    assert result["total"]["runs"] == 4
    assert result["total"]["seconds"] == pytest.approx(
        7.0 + sum(p["seconds"] for p in result["points"]))
    assert result["slurm"]["gpus_per_task"] == 0 and result["slurm"]["tasks"] == 4
    longest = max(p["seconds"] for p in result["points"])
    assert result["slurm"]["time_s"] == int(-(-((7.0 + longest) * plan.MARGIN
                                                + plan.MARGIN_MIN_S) // 1))
    json.dumps(result)                                        # --json prints it


def test_a_task_is_read_once_whatever_the_batch_size_and_buckets(monkeypatch):
    """The plan asks a point's facts without and with its length buckets, and points of one
    task differ in batch size: the files are read and sampled once per token key."""
    from kit.data.pipeline import StaticShape
    from kit.models.backbones import load_tokenizer
    reads, real = [], costs.load_task_data
    monkeypatch.setattr(costs, "load_task_data", lambda cfg: reads.append(1) or real(cfg))
    costs._read.cache_clear()
    tokenizer, cfg = load_tokenizer("tiny"), RunConfig(task="RTE", max_length=64, batch_size=16)
    plain = costs.task_facts(cfg, tokenizer)
    bucketed = costs.task_facts(cfg, tokenizer, StaticShape(64, 16))
    other = costs.task_facts(replace(cfg, batch_size=32), tokenizer)
    assert len(reads) == 1 and plain.train_rows == bucketed.train_rows == other.train_rows == 2490
    # every length is padded up to its bucket's: never shorter than unbucketed
    assert bucketed.train_length >= plain.train_length and bucketed.dev_length >= plain.dev_length
    assert other.train_length != plain.train_length          # batches of other rows


@pytest.mark.parametrize("per_device, mem", [(1, "7G"), (2, "11G")])
def test_the_plans_mem_is_what_slurm_asks_for_k_points_at_once(per_device, mem):
    """3 GiB a point, x1.5 + 2 GiB: 7G for one; a task that runs 2 at once (per_device) holds
    two: 11G, as kit.slurm asks (both through kit.cluster.costs.task_memory)."""
    probes = {"a": {"device": "cpu", "peak_memory_bytes": 3 * 2**30, "model_bytes": 1}}
    request = plan.slurm_request([{"seconds": 60.0}], probes, per_device=per_device)
    assert request["mem"] == mem == costs.task_memory(probes.values(), plan.MARGIN, per_device)


@pytest.mark.parametrize("length, classes", [
    (3.0, (8, 16, 0.0)), (11.9, (8, 16, 0.4875)), (16.0, (16, 24, 0.0)), (130.0, (128, 136, 0.25))])
def test_a_points_length_lies_between_two_probed_classes(length, classes):
    assert costs.length_classes(length) == pytest.approx(classes)
    probed = []

    def at(n):
        probed.append(n)
        return {"s_per_step": n / 100, "s_per_eval_batch": n / 10, "peak_memory_bytes": n}
    got = point_cost.between(at, length)
    lower, upper, w = classes
    assert got["s_per_step"] == pytest.approx((lower + w * 8) / 100)
    assert got["s_per_eval_batch"] == pytest.approx((lower + w * 8) / 10)
    assert probed == ([lower, upper] if w else [lower])        # an exact class: one probe
    assert got["peak_memory_bytes"] == probed[-1]


def test_notebook_span_reads_papermills_stamps_or_none(tmp_path):
    from kit import runs
    assert runs.notebook_span(tmp_path) is None
    runs.notebook_path(tmp_path).write_text(json.dumps({"metadata": {"papermill": {
        "start_time": "2026-11-28T10:00:00.250000", "end_time": "2026-11-28T10:00:03.000000"}}}))
    start, end = runs.notebook_span(tmp_path)
    assert end - start == pytest.approx(2.75)


def test_plan_of_the_smoke_profile_probes_the_tiny_model(capsys, tmp_path):
    assert plan.main(["smoke", "--only", "method=bert,ssa-h", "--budget", "0.3", "--outputs",
                      str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("plan of smoke: 2 point(s) on ") and "class" in out[0]
    assert out[2].split()[:6] == ["synthetic", "bert", "s0", "200", "2", "32"]
    assert out[4].startswith("total: 2 run(s), 28 steps, ") and "device-hours), peak" in out[4]
    assert re.search(r"peak memory [\d.]+ [KMG]iB; disk kept [\d.]+ ([KMG]i)?B, ", out[4])
    # what a batch pays around its runs, measured by running a tiny one (kit.plan.batch_probe)
    assert re.match(r"batch: \d+ s once \(start-up, the kernel, the tables and report\), "
                    r"\d+\.\d s a point around its run$", out[5]), out[5]
    # the time itself follows the probes (the machine's load): its form and margin are fixed
    assert re.match(r"slurm: --time \d\d:\d\d:\d\d \(the longest of 2 task\(s\), .*, x1\.5 \+ "
                    r"10 min\), --mem \d+G, 0 GPU\(s\) a task$", out[6]), out[6]
    # kept for ./run_all.sh slurm under the grid's digest (tests/test_slurm.py takes it)
    profile = load_profile("smoke", str(tmp_path), ["method=bert,ssa-h"])
    kept = plan.saved_path(profile, tmp_path)
    assert out[-1] == f"saved: {kept} (./run_all.sh slurm without --time takes its --time from it)"
    assert plan.saved(profile, tmp_path)["total"]["runs"] == 2 and "made" in plan.saved(
        profile, tmp_path)


def test_a_hub_model_not_cached_offline_says_to_fetch_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(Exception, match=r"run `\./run_all\.sh fetch --model nobody/nothing` on"):
        plan.tokenizer_of("nobody/nothing")


# ------------------------------------------------------------------ disk pre-flight

def test_the_batch_refuses_a_grid_the_disk_cannot_hold(monkeypatch, tmp_path):
    points = load_profile("demo", str(tmp_path)).points
    weights = costs.weights_bytes("minilm")
    assert weights > 80_000_000                               # the embedded model's file
    needed, counted = costs.disk_needed(points, set())
    one = costs.checkpoint_disk(RunConfig(), weights)
    assert counted == 8 and needed == 8 * one.kept + (one.peak - one.kept)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, needed - 1))
    with pytest.raises(ConfigError) as err:
        costs.check_disk(points, set(), tmp_path)
    assert f"need {needed / 2**30:.1f} GiB" in str(err.value)
    assert f"{(needed - 1) / 2**30:.1f} GiB free" in str(err.value) and "--ignore-disk" in str(
        err.value)
    finished = set(ids(points))
    costs.check_disk(points, finished, tmp_path)             # nothing to go: nothing needed


def test_on_a_gpu_the_plan_probes_the_graphs_its_long_points_will_take(monkeypatch):
    """cuda_graphs: auto as the run's own loop resolves it (kit.models.regional_compile): with
    plain BERT verified, a CUDA point of 4,200+ steps is probed with graphs and pays their
    compilation once per run; a shorter one is probed eager. The GPU and the table's row are
    pretended (no GPU run has verified one yet): the probe is fake, the resolution real."""
    import kit.models.regional_compile as regional
    import kit.train.accel as accel
    monkeypatch.setattr(accel, "machine_device", lambda: "cuda")
    monkeypatch.setattr(regional, "VERIFIED", (regional.Verified("bert", 1, 1, "pretended"),))
    monkeypatch.setattr(plan, "tokenizer_of", lambda model: __import__(
        "kit.models.backbones", fromlist=["x"]).load_tokenizer("tiny"))
    monkeypatch.setattr(plan, "saved_bytes", lambda tokenizer: 100)
    seen = []

    def probe(step, length, graphs=False, **_):
        seen.append((length, graphs))
        return {**fake_probe(step, length), "graphs": graphs,
                "graph_warmup_s": 70.0 if graphs else 0.0}
    profile = load_profile("paper-base", only=["task=RTE,SST-2", "seed=0", "method=bert"])
    by = {p["label"]: p for p in plan.plan(profile, probe=probe, overhead=AROUND)["points"]}
    rte, sst2 = by["RTE bert s0"], by["SST-2 bert s0"]
    assert (rte["steps"], rte["cuda_graphs"]) == (3 * 78, False)             # 234 < 4,200
    assert (sst2["steps"], sst2["cuda_graphs"]) == (3 * 2105, True)          # 67,349 rows
    assert sst2["prepare_s"] >= 1.0 + 70.0 > rte["prepare_s"]    # build + compilation
    assert {g for _, g in seen} == {False, True} and len(set(seen)) == len(seen)   # each once


def test_a_batch_of_part_of_a_profile_counts_for_the_whole(tmp_path, batch_kernel, capsys):
    """--only task=synthetic trains that task's points alone; the whole profile's tables (its
    runs list) count them, under the same run ids."""
    import csv
    from kit import batch
    profile = tmp_path / "two.yaml"
    profile.write_text(yaml.safe_dump({"report": False, "grid": {
        "task": ["synthetic", "synthetic-pair"], "method": ["bert", "ssa-h"], "model": "tiny",
        "synthetic_size": 64, "epochs": 1, "lr": 5.0e-3, "save_checkpoints": False}}))
    outputs = tmp_path / "out"
    assert batch.main([str(profile), "--only", "task=synthetic", "--outputs", str(outputs)]) == 0
    assert "profile two: 2 runs, data checked in" in capsys.readouterr().out
    part = ids(load_profile(str(profile), str(outputs), ["task=synthetic"]).points)
    assert sorted(d.name for d in (outputs / "runs").iterdir()) == sorted(part)
    assert batch.report_only(str(profile), str(outputs)) == 0       # the whole profile's
    with open(outputs / "tables" / "two-runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["run_id"] for r in rows if r["status"] == "ok") == sorted(part)


@pytest.mark.parametrize("shared, per_device, seconds", [
    (False, 1, 300.0), (False, 2, 150.0), (True, 1, 300.0), (True, 2, 300.0)])
def test_k_points_divide_the_total_on_a_cpu_not_on_a_shared_gpu(shared, per_device, seconds):
    """A CPU's K points were each probed on cores / K threads: they run side by side. On one
    GPU the probe had it alone; K points share it, and what that gains is measured by
    bench/gpu.sh, not assumed: the plan keeps the serial sum and says so."""
    points = [{"seconds": 100.0, "disk_kept_bytes": 0, "disk_peak_bytes": 0, "steps": 1,
               "memory_bytes": 1} for _ in range(3)]
    total = plan._total(points, per_device, 0.0, shared=shared)
    assert total["seconds"] == seconds and total["device_hours"] == round(300 / 3600, 2)
    assert bool(total["k_note"]) == (shared and per_device > 1)


def test_a_probe_batch_that_fails_is_one_line_naming_its_last_words(monkeypatch, capsys):
    """kit.cluster.overhead runs `python -m kit.batch` on two tiny points; a batch that cannot
    run there (a kernel that will not start ...) stops the plan in one line, not a traceback."""
    import subprocess

    from kit.cluster import overhead
    monkeypatch.setattr(overhead.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a[0], 1, "", "Traceback ...\nNoSuchKernel: No such kernel named python3\n"))
    monkeypatch.setattr(plan, "tokenizer_of", lambda model: __import__(
        "kit.models.backbones", fromlist=["x"]).load_tokenizer("tiny"))
    monkeypatch.setattr("kit.train.model_probe.model_probe", fake_probe)
    assert plan.main(["smoke", "--only", "method=bert"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: the plan's probe batch (two points of the tiny model on the synthetic "
                   "task) failed, exit 1: NoSuchKernel: No such kernel named python3\n")


# ------------------------------------------------------------------ each point's own step

@pytest.fixture
def tiny_tokenizer(monkeypatch):
    """The plan without the hub: every model's tokenizer the tiny model's, 100 bytes saved."""
    from kit.models.backbones import load_tokenizer
    monkeypatch.setattr(plan, "tokenizer_of", lambda model: load_tokenizer("tiny"))
    monkeypatch.setattr(plan, "saved_bytes", lambda tokenizer: 100)


def grid_profile(tmp_path, **grid):
    """A profile of the tiny model on the synthetic task, `grid` on top."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"grid": {"task": "synthetic", "model": "tiny",
                                             "synthetic_size": 64, "epochs": 1, **grid}}))
    return load_profile(str(path), str(tmp_path))


@pytest.mark.parametrize("method, guide_loss, attention, maps, token_head, hybrid", [
    ("bert", "task+both", "eager", True, False, False),
    ("ssa-h", "task", "sdpa", False, True, True),
    ("bert-mask", "task", "sdpa", False, False, False),
])
def test_the_probe_builds_and_trains_the_points_own_model(tmp_path, monkeypatch, tiny_tokenizer,
                                                          method, guide_loss, attention, maps,
                                                          token_head, hybrid):
    """The real probe, its model seen where it is built (kit.train.model_probe.build_model): a
    guide loss's point trains an eager encoder that returns its attention maps, SSA-H's the
    token head and its token mix; BERT-mask's trains BERT's model."""
    from kit import methods
    from kit.train import model_probe
    built, calls = [], []

    def seen(cfg):
        model, tokenizer = build(cfg)
        built.append(model)
        model.register_forward_hook(lambda m, args, kwargs, out: calls.append(
            (m.training, out["attentions"] is not None, out["token_logits"] is not None)),
            with_kwargs=True)
        return model, tokenizer
    build = model_probe.build_model
    monkeypatch.setattr(model_probe, "build_model", seen)
    profile = grid_profile(tmp_path, method=method, guide_loss=guide_loss)
    point, = plan.plan(profile, budget_s=0.01, overhead=AROUND)["points"]
    model = built[-1]
    assert model.backbone.config._attn_implementation == attention == point["attention"]
    assert (model.token_head is not None, methods.get(model.spec.method).hybrid) == (
        token_head, hybrid)
    training = {(maps_out, tokens) for train, maps_out, tokens in calls if train}
    assert training == {(maps, token_head)}                   # the run's loss: maps, SSA labels
    assert point["step_method"] == ("bert" if method == "bert-mask" else method)
    assert point["label"] == f"synthetic {method}{' ' + guide_loss if maps else ''} s0"


def test_points_of_one_step_share_its_probes(tmp_path, tiny_tokenizer):
    """Seeds, lr and BERT-mask's copies change no step: one probe per length class; a guide
    loss or SSA's heads are steps of their own."""
    seen = []

    def probe(step, length, **kw):
        seen.append((step.method, step.guide_loss, length))
        return fake_probe(step, length)
    profile = grid_profile(tmp_path, seed=[0, 1, 2], method=["bert", "bert-mask", "ssa-co"],
                           guide_loss=["task", "task+pd"], lr=[1e-4, 2e-4])
    result = plan.plan(profile, probe=probe, overhead=AROUND)
    assert len(result["points"]) == 36 and len(seen) == len(set(seen))
    assert {(m, g) for m, g, _ in seen} == {(m, g) for m in ("bert", "ssa-co")
                                            for g in ("task", "task+pd")}
    assert {n for _, _, n in seen} == {8, 16}                 # the synthetic task's ~11 tokens


def test_a_point_reusing_labels_is_charged_no_probing(tmp_path, tiny_tokenizer):
    """reuse_labels_from reads the labels that run saved: its evaluated rows are the dev set's,
    its eval time the same as BERT's, where SSA itself probes 2 x 64 rows an epoch."""
    path = tmp_path / "p.yaml"
    small = {"task": "synthetic", "model": "tiny", "synthetic_size": 64, "epochs": 2,
             "gamma": 1.0}
    path.write_text(yaml.safe_dump({"grid": [
        {**small, "method": "ssa-h"}, {**small, "method": "bert"},
        {**small, "method": "ssa-h", "seed": 1, "reuse_labels_from": "outputs/runs/x"}]}))
    profile = load_profile(str(path), str(tmp_path))
    probing, bert, reusing = plan.plan(profile, probe=fake_probe, overhead=AROUND)["points"]
    dev = probing["dev_rows"]
    assert (probing["probe_rows"], probing["eval_rows"]) == (2 * 64, 2 * dev + 2 * 64)
    assert (reusing["probe_rows"], reusing["eval_rows"]) == (0, 2 * dev)
    assert reusing["eval_s"] == bert["eval_s"] == round(2 * dev * 0.128 / 128, 1)
    assert probing["eval_s"] > reusing["eval_s"]


def test_a_tasks_tokens_are_charged_once(monkeypatch, tiny_tokenizer):
    """The token cache tokenizes a task's splits for its first point; the others read them."""
    profile = load_profile("paper-base", only=["task=RTE", "seed=0,1", "method=bert,ssa-h"])
    points = plan.plan(profile, probe=fake_probe, overhead=AROUND)["points"]
    first, *others = points
    assert len(points) == 4 and first["tokenize_s"] > 0
    assert [p["tokenize_s"] for p in others] == [0.0, 0.0, 0.0]
    assert [p["prepare_s"] for p in others] == [1.0, 1.0, 1.0]          # the build alone
    assert first["prepare_s"] == pytest.approx(1.0 + first["tokenize_s"], abs=0.11)


def test_length_buckets_price_the_buckets_length(tmp_path, tiny_tokenizer):
    """length_buckets on pads each batch to a multiple of 16 (kit.data.pipeline.StaticShape):
    the synthetic task's rows (at most 16 tokens) all train and evaluate at 16."""
    lengths = []

    def probe(step, length, **kw):
        lengths.append(length)
        return fake_probe(step, length)
    profile = grid_profile(tmp_path, method="ssa-co", length_buckets=["off", "on"])
    off, on = plan.plan(profile, probe=probe, overhead=AROUND)["points"]
    assert off["tokens"] < 16 and on["tokens"] == 16.0
    assert on["train_s"] == round(on["steps"] * 32 * 16 / 1000, 1) > off["train_s"]
    assert sorted(set(lengths)) == [8, 16]


def test_sizes_are_printed_in_gib():
    assert [plan.size(n) for n in (512, 1536, 3 * 2**20, 2.5 * 2**30, 2**41)] == [
        "512 B", "1.5 KiB", "3.0 MiB", "2.5 GiB", "2.0 TiB"]

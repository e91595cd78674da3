"""The notebooks' views of one trained run: SSA on the tokens (kit.results.views.token_html: the
saved labels, the checkpoint's P(important) and attention, as HTML, and the report's token section),
the model's dev predictions (kit.results.views.model_view, through kit.predict), and the figure
kinds listed once (kit.config.profiles.FIGURES). One tiny SSA-H run trained once for the module."""
import json
import re
from pathlib import Path

import matplotlib
import nbformat
import numpy as np
import pandas as pd
import pytest

from kit import runs
from kit.config.profiles import FIGURES, load_profile
from kit.config.run_config import ConfigError, RunConfig
from kit.data import synthetic
from kit.predict import predict
from kit.results.figures import plots
from kit.results.views import model_view, token_html
from kit.results.report import page, profile_outputs
from kit.results.figures.model_scores import token_scores

matplotlib.use("Agg")
pytestmark = pytest.mark.usefixtures("one_thread")

CUE_WORDS = set(synthetic.POSITIVE + synthetic.NEGATIVE + synthetic.NEGATIONS)
POINT = dict(task="synthetic", model="tiny", method="ssa-h", synthetic_size=200, epochs=2,
             lr=5e-3, save_labels=True, report_to=("none",))
SPAN = re.compile(r'<span style="display:inline-block;padding:0 3px;[^"]*'
                  r'background-color:(#[0-9a-f]{6});color:#[0-9a-f]{6};border-bottom:([^"]*)" '
                  r'title="[^"]*">([^<]*)</span>')


@pytest.fixture(scope="module")
def ssa_run(tmp_path_factory):
    """A finished tiny SSA-H run on the synthetic task: best checkpoint, SSA labels saved."""
    from kit.train.finetune import fit
    out = tmp_path_factory.mktemp("views")
    cfg = RunConfig(**POINT, outputs_dir=str(out))
    assert fit(cfg)["status"] == "ok"
    return runs.run_dir_of(cfg)


def spans(text: str) -> list[tuple[str, bool, str]]:
    """(background, underlined as a cue, word-piece) of every word-piece in a view's HTML."""
    return [(bg, border == token_html.CUE, token) for bg, border, token in SPAN.findall(text)]


# ---------------------------------------------------------------- SSA on the tokens

def test_the_labels_view_is_the_saved_labels(ssa_run):
    view = token_html.show_tokens(ssa_run, n=4)
    assert view.by == "labels" and view._repr_html_() == view.html
    saved = list(runs.read_saved_labels(ssa_run))[-1]
    rows, rule = saved["epoch_set"], saved["stats"]["rule"]
    assert rule == "paper" and f"epoch {saved['stats']['epoch']} (paper rule" in view.title
    probed = [i for i, labels in enumerate(rows["ssa_labels"]) if (labels >= 0).any()][:4]
    tokenizer = token_html.run_tokenizer(ssa_run, runs.read_config(ssa_run))
    frame = view.frame
    for sid, row in enumerate(probed):
        real = ~rows["special"][row].astype(bool)
        got = frame[frame["sentence_id"] == sid]
        assert got["token"].tolist() == tokenizer.convert_ids_to_tokens(
            rows["input_ids"][row][real].tolist())
        labels = rows["ssa_labels"][row][real]
        np.testing.assert_array_equal(got["value"], np.where(labels >= 0, labels, np.nan))
        np.testing.assert_array_equal(got["cue"], rows["importance"][row][real])
        gold = ("negative", "positive")[rows["labels"][row]]
        assert set(got["label"]) == {gold} and set(got["prediction"]) == {f"{gold} (probe)"}
    # the HTML: every word-piece in order, coloured by its label, cue words underlined
    shown = spans(view.html)
    assert [t for _, _, t in shown] == frame["token"].tolist()
    colours = {1.0: "#fd8d3c", 0.0: "#9ecae1"}
    assert [bg for bg, _, _ in shown] == [colours.get(v, "#ffffff") for v in frame["value"]]
    assert [cue for _, cue, _ in shown] == (frame["cue"] == 1).tolist()
    assert frame.loc[frame["cue"] == 1, "token"].isin(CUE_WORDS).all()
    for legend in ("SSA label: ", ">1 important<", ">0<", ">not labelled<", ">true cue word<"):
        assert legend in view.html


def test_the_checkpoint_views_of_dev_sentences(ssa_run):
    view = token_html.show_tokens(ssa_run, n=5, by="p_important")
    frame = view.frame
    dev = synthetic.generate(False, 50, "dev")
    scores = token_scores(ssa_run, dev.text_a[:5], max_length=128)
    assert frame["token"].tolist() == scores["token"].tolist()
    np.testing.assert_array_equal(frame["value"], scores["p_important"])
    # the true cue words are the cue lists' words (distractors never are one), each marked
    assert (frame["cue"] == 1).tolist() == frame["token"].isin(CUE_WORDS).tolist()
    names = {0: "negative", 1: "positive"}
    assert frame.groupby("sentence_id")["label"].first().tolist() == [
        names[y] for y in dev.labels[:5]]
    assert frame.groupby("sentence_id")["prediction"].first().tolist() == \
        scores.groupby("sentence_id")["prediction"].first().tolist()
    assert len(re.findall(r"<tr", view.html)) == 6           # the header and 5 sentences
    assert [bg for bg, _, _ in spans(view.html)] == [
        token_html.colour("p_important", v) for v in frame["value"]]
    # attention: scaled to each sentence's largest weight; your own sentences, a pair's marker
    mine = token_html.show_tokens(ssa_run, by="attention", sentences=["a good movie", "not bad"])
    assert mine.frame.groupby("sentence_id")["value"].max().tolist() == [1.0, 1.0]
    assert mine.frame["cue"].isna().all() and "true cue word" not in mine.html
    assert "your sentences" in mine.title


def test_colours_and_the_auto_view(ssa_run, tmp_path):
    assert token_html.colour("p_important", 0.5) == "#f2aa86"      # halfway from white
    assert token_html.colour("p_important", 1.0) == "#e6550d"
    assert token_html.colour("attention", 0.0) == "#ffffff"
    assert token_html.colour("attention", 1.0) == "#3182bd"
    assert token_html.colour("labels", np.nan) == "#ffffff"
    frame = pd.DataFrame({"sentence_id": [0, 0, 0], "position": [0, 1, 2],
                          "token": ["red", "<b>", "sky"], "value": [0.0, 0.5, 1.0],
                          "cue": [1.0, 0.0, 0.0], "segment": [0, 1, 1], "label": ["same"] * 3,
                          "prediction": ["different"] * 3, "confidence": [0.75] * 3})
    text = token_html.render(frame, "attention", "t")
    assert spans(text) == [("#ffffff", True, "red"), ("#98c0de", False, "&lt;b&gt;"),
                           ("#3182bd", False, "sky")]
    assert text.count("‖") == 1 and ">different (0.75)<" in text and ">same<" in text
    assert "<style" not in text and "<script" not in text
    # auto: labels when saved; else P(important) for a token-head method; else attention
    assert token_html.pick_view(ssa_run) == "labels"
    assert token_html.pick_view(ssa_run, own_sentences=True) == "p_important"
    config = runs.read_config(ssa_run)
    for method, view in (("ssa-co", "p_important"), ("bert", "attention")):
        folder = tmp_path / method
        folder.mkdir()
        runs.config_path(folder).write_text(json.dumps({**config, "method": method}))
        assert token_html.pick_view(folder) == view
    nothing = token_html.show_tokens(tmp_path / "bert")      # no checkpoint, no labels: a line
    assert nothing.frame.empty and "no token view: the run kept no checkpoint" in nothing.html
    with pytest.raises(ValueError, match="no saved SSA labels: they exist for ssa-co / ssa-h"):
        token_html.show_tokens(tmp_path / "bert", by="labels")
    with pytest.raises(ValueError, match="by='nope'; choose auto, labels, p_important"):
        token_html.show_tokens(ssa_run, by="nope")


def test_the_report_shows_the_token_section_of_runs_with_saved_labels(ssa_run, tmp_path,
                                                                      monkeypatch):
    """page.build's HTML, its notebooks rendered by a stand-in (nbconvert's page is
    tests/test_report_page.py's)."""
    out = ssa_run.parent.parent                            # <outputs>/runs/<run_id>
    path = tmp_path / "tokens.yaml"
    path.write_text("report: true\ngrid:\n" + "".join(
        f"  {k}: {json.dumps(v)}\n" for k, v in POINT.items()))
    profile = load_profile(str(path), str(out))
    assert runs.run_dir_of(RunConfig.from_dict(profile.points[0])) == ssa_run

    def execute(notebook, output, parameters):          # no kernel: a stand-in notebook
        nbformat.write(nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_markdown_cell(f"# {notebook.stem}")]), output)
    monkeypatch.setattr(page, "render", lambda notebooks, title, exclude_input, skip_tags=(): (
        "<html><body><main><h1>results</h1></main></body></html>"))
    text = page.build(profile, out, execute).read_text()
    section = re.search(r'<section id="kit-tokens".*?</section>', text, re.S)[0]
    assert text.index(section) > text.index("<h1>results</h1>")   # below the notebooks
    assert text.index(section) < text.index("</main>")
    assert "SSA on the tokens" in section and ssa_run.name in section
    view = token_html.label_tokens(ssa_run, token_html.REPORT_SENTENCES)
    assert view.html in section
    assert page.remote_references(text) == []
    assert token_html.report_section([tmp_path]) == ""        # no labels saved: no section


def test_the_token_views_decode_only_the_epoch_they_show(ssa_run, tmp_path, monkeypatch):
    """A run that saved 3 SSA epochs: whether it saved any is read from the file names, the
    labels view and the report's token section decode the one epoch they show (the last)."""
    import shutil
    from kit.runs import arrays
    run = tmp_path / ssa_run.name
    shutil.copytree(ssa_run, run)
    last = max(runs.saved_labels_dir(run).glob("epoch*.safetensors"))
    epoch = int(last.stem.removeprefix("epoch"))
    for later in (epoch + 1, epoch + 2):
        shutil.copy(last, runs.saved_labels_dir(run) / f"epoch{later}.safetensors")
    decoded = []
    read_arrays = arrays.read_arrays
    monkeypatch.setattr(arrays, "read_arrays", lambda path: decoded.append(Path(path).name)
                        or read_arrays(path))
    assert token_html.pick_view(run) == "labels" and decoded == []
    view = token_html.show_tokens(run, n=2)
    assert view.by == "labels" and decoded == [f"epoch{epoch + 2}.safetensors"]
    decoded.clear()
    assert view.html in token_html.report_section([run], n=2)
    assert decoded == [f"epoch{epoch + 2}.safetensors"]
    decoded.clear()
    token_html.show_tokens(run, n=2, epoch=epoch)
    assert decoded == [f"epoch{epoch}.safetensors"]


# ---------------------------------------------------------------- the trained model

def test_a_gold_label_is_shown_one_way_in_every_view(tmp_path):
    """SST-2's classes "0" / "1" are negative / positive in the token views, the case study
    and the dev predictions alike (token_view.label_name, the one rendering)."""
    from kit.config.tasks import get_task
    cfg = RunConfig(task="SST-2", model="tiny", method="bert", glue_dir="data/glue",
                    outputs_dir=str(tmp_path))
    run_dir = runs.make_run_dir(cfg)
    runs.config_path(run_dir).write_text(json.dumps(cfg.to_dict()))

    def predict_one(run_dir, texts):                  # kit.predict's columns: class names
        return pd.DataFrame({"prediction": ["1"] * len(texts), "prob_0": 0.25, "prob_1": 0.75})
    frame = model_view.dev_predictions(run_dir, predict_one, max_rows=6)
    shown = {"negative", "positive"}
    assert set(frame["label"]) <= shown and set(frame["prediction"]) == {"positive"}
    assert frame.columns[-2:].tolist() == ["prob_negative", "prob_positive"]
    assert model_view.confusion(frame).columns.tolist() == ["negative", "positive"]
    config = runs.read_config(run_dir)
    assert [token_html.label_text(config, y) for y in (0, 1)] == ["negative", "positive"]
    from kit.results.figures.token_view import label_name
    sst2 = get_task("SST-2")
    assert [label_name(sst2, 1), label_name(sst2, "1"), label_name(sst2, np.int64(0))] == \
        ["positive", "positive", "negative"]
    assert label_name(get_task("STS-B"), 3.14159) == "3.14" and label_name(None, 2) == "2"


def test_the_best_epoch_is_said_in_one_line_everywhere(tmp_path):
    """The notebooks' summary line and the end of `python -m kit.run` say a finished run's best
    epoch in the same words (run_view.best_epoch_line)."""
    import kit.run
    from kit.results.views import run_view
    cfg = RunConfig(task="synthetic", model="tiny", method="bert", outputs_dir=str(tmp_path))
    run_dir = runs.make_run_dir(cfg)
    metrics = {**runs.base_record(cfg), "status": "ok", "best_epoch": 1,
               "best_dev": {"accuracy": 0.8125, "f1": 0.80104, "score": 0.8125},
               "epochs": [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}]}
    runs.metrics_path(run_dir).write_text(json.dumps(metrics))
    line = "best epoch 2/3, accuracy 0.8125, f1 0.8010"
    assert kit.run.summary("ok", "", cfg).splitlines()[-1] == f"  {line}"
    assert run_view.summary_line(metrics) == f"{cfg.run_id} ok: {line}"
    assert run_view.best_epoch_line(metrics) == line


def test_dev_predictions_are_kit_predicts(ssa_run):
    frame = model_view.dev_predictions(ssa_run, predict)
    dev = synthetic.generate(False, 50, "dev")
    assert frame.columns.tolist() == ["sentence", "label", "prediction", "confidence", "correct",
                                      "prob_negative", "prob_positive"]
    assert frame["sentence"].tolist() == dev.text_a
    assert frame["label"].tolist() == [("negative", "positive")[y] for y in dev.labels]
    expected = predict(ssa_run, dev.text_a)
    pd.testing.assert_frame_equal(frame[expected.columns], expected)
    assert frame["confidence"].tolist() == expected[["prob_negative", "prob_positive"]].max(
        axis=1).tolist()
    assert frame.attrs == {"task": "synthetic", "split": "dev", "regression": False,
                           "pair": False, "run_id": ssa_run.name}
    assert len(model_view.dev_predictions(ssa_run, predict, max_rows=7)) == 7
    errors = model_view.surest_errors(frame, 5)
    assert (~errors["correct"]).all() and len(errors) == min(5, (~frame["correct"]).sum())
    assert errors["confidence"].is_monotonic_decreasing
    # the surest error first (a run that errs nowhere has none: an empty frame, no first row)
    assert errors["confidence"].head(1).tolist() == (
        frame.loc[~frame["correct"], "confidence"].nlargest(1).tolist())
    table = model_view.confusion(frame)
    assert table.index.tolist() == table.columns.tolist() == ["negative", "positive"]
    for (label, prediction), count in frame.groupby(["label", "prediction"]).size().items():
        assert table.loc[label, prediction] == count
    assert table.to_numpy().sum() == len(frame)


def test_regression_errors_and_their_plot():
    frame = pd.DataFrame({"label": [1.0, 2.0, 3.0, 4.0], "prediction": [1.5, 0.0, 3.0, 4.5]})
    frame["error"] = frame["prediction"] - frame["label"]
    # |-2| first, then a tie of |0.5|: in row order
    assert model_view.surest_errors(frame, 3).index.tolist() == [1, 0, 3]
    ax = model_view.plot_regression(frame)
    assert ax.get_xlabel() == "label" and len(ax.collections[0].get_offsets()) == 4
    r = np.corrcoef(frame["label"], frame["prediction"])[0, 1]
    assert ax.get_title().endswith(f"Pearson r = {r:.3f}")


# ---------------------------------------------------------------- figure kinds, listed once

def test_figure_kinds_are_listed_once_and_checked_when_a_profile_loads(tmp_path):
    assert set(profile_outputs.DRAW) == set(FIGURES) == set(page.FIGURE_NOTEBOOKS)
    assert all(callable(getattr(plots, name)) for name in profile_outputs.DRAW.values())
    assert all((page.PROJECT / "notebooks" / f"{nb}.ipynb").exists()
               for nb in page.FIGURE_NOTEBOOKS.values())
    path = tmp_path / "f.yaml"
    path.write_text("figures: [label-quality, costs]\ngrid:\n  task: synthetic\n")
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert str(err.value) == (f"{path}: unknown figure 'costs' in `figures:`; choose from "
                              "label-quality, cost, gamma")
    path.write_text("figures: gamma\ngrid:\n  task: synthetic\n")
    assert load_profile(str(path)).figures == ("gamma",)


# ---------------------------------------------------------------- show: tables as a page reads

def test_show_table_hides_row_numbers_keeps_a_real_index_and_says_its_caption():
    from kit.results.views import show
    frame = pd.DataFrame({"method": ["bert", "ssa-h"], "score": [0.8125, float("nan")]})
    frame.attrs.update(notes=["1 run (seed) per cell."], caption="Dev accuracy x100.")
    shown = show.table(frame)
    page = shown._repr_html_()
    assert "<caption>1 run (seed) per cell. Dev accuracy x100.</caption>" in page
    assert ">0<" not in page and ">1<" not in page                 # no 0, 1 row numbers
    assert ">0.8125<" in page and ">nan<" not in page
    assert repr(shown).splitlines() == ["1 run (seed) per cell. Dev accuracy x100.",
                                        "method  score", "  bert 0.8125", " ssa-h       "]
    indexed = show.table(frame.set_index("method"), caption="")._repr_html_()
    assert ">ssa-h<" in indexed and "<caption>" not in indexed
    assert show.table(frame.iloc[:0], empty="Nothing to select.")._repr_html_() == (
        "<p>Nothing to select.</p>")


def test_show_written_names_the_files_by_folder(tmp_path, capsys, monkeypatch):
    from kit.results.views import show
    monkeypatch.chdir(tmp_path)
    show.written([tmp_path / "tables" / "demo.md", tmp_path / "tables" / "demo.csv", Path("/x/a.png")])
    assert capsys.readouterr().out == ("Written to tables: demo.md, demo.csv\n"
                                       "Written to /x: a.png\n")

"""THE outputs contract: what a run writes under outputs/runs/<run_id>/ and how it is read back.

    config.json        the resolved RunConfig, written when the run starts, and `resolved`: what
                       its `auto` settings became (cuda_graphs, length_buckets), once known
    metrics.json       status ok / failed (+ error) / preempted (+ where it stopped: a signal
                       stopped it after a checkpoint; rerunning resumes), written atomically
    history.csv        one row per logging step
    predictions/       dev predictions of the best epoch (<split>.tsv, multi-task <TASK>/<split>.tsv),
                       test predictions in the GLUE server's format, submission.csv (CSV tasks)
    checkpoint/        best (kit.models.model_io's layout: plain transformers loads it) and last
                       (accelerate's save_state: model, optimizer, RNGs, loop progress; for
                       resuming); written and restored by kit.train.run_state
    ssa_labels/        each SSA epoch's training set and label statistics, epoch<N>.safetensors
                       (save_labels: true; kit.runs.arrays' format, never a pickle: outputs/
                       may be shared; written by write_saved_labels, read by read_saved_labels)
    notebook.ipynb     written by kit.batch

Every reader and writer of a run folder is in this package (torch is not imported at module
level: tables and figures run without it): `read` (paths, and what the files say), `write`
(the folder, history, predictions, saved labels) and `lifecycle` (how a run begins and ends: the
lock, config.json and metrics.json, and the one rerun protocol). A finished run (metrics.json
status ok) is reused, unless rerun replaces it with a run that ends ok; a lock keeps two
processes from training one config at once. `from kit.runs import X` reaches every name of
`__all__`, the package's API: its one import path outside kit.runs.
"""
from kit.runs.lifecycle import (KEPT, RunLocked, RunPreempted, aside_line, base_record,
                            begin, end_rerun, lock, record_blocked, record_failed,
                            record_resolved, run_recorded)
from kit.runs.read import (best_checkpoint, blocked_source, checkpoint_dir, config_path,
                           dev_predictions_path, finished_metrics, history_path, metrics_path,
                           metrics_stamp, notebook_error, notebook_path, notebook_span,
                           predictions_dir,
                           previous_dir, read_config, read_dev_predictions, read_history,
                           read_json, read_metrics, read_saved_epoch, read_saved_labels,
                           readable_metrics, run_dir_of, run_folders, run_started, runs_root,
                           saved_label_epochs, saved_labels_dir, saved_labels_path)
from kit.runs.write import (label_text, make_run_dir, write_dev_predictions,
                            write_history, write_saved_labels, write_test_predictions)

__all__ = [
    "aside_line", "base_record", "begin", "best_checkpoint", "checkpoint_dir", "config_path",
    "dev_predictions_path", "end_rerun", "finished_metrics", "history_path", "KEPT", "label_text",
    "lock", "make_run_dir", "metrics_path", "metrics_stamp", "notebook_error", "notebook_path",
    "notebook_span",
    "predictions_dir", "previous_dir", "read_config", "read_dev_predictions", "read_history",
    "read_json", "read_metrics", "read_saved_epoch", "read_saved_labels", "readable_metrics",
    "record_blocked", "record_failed", "record_resolved", "run_dir_of", "run_folders", "run_recorded", "run_started", "RunLocked",
    "RunPreempted", "runs_root", "saved_label_epochs", "saved_labels_dir", "saved_labels_path",
    "blocked_source",
    "write_dev_predictions", "write_history", "write_saved_labels", "write_test_predictions",
]

"""On a machine with a network (a cluster's login node): GLUE tasks and models fetched for runs
that have none (compute nodes with HF_HUB_OFFLINE=1).

    ./run_all.sh fetch [TASK ...] [--model ID ...] [--glue-dir DIR]

Each GLUE task's splits (train, dev, test) that DIR/<TASK>/ lacks are written there from the
hub's copy (nyu-mll/glue) as the GLUE files kit.data.readers reads (default DIR: the project's
data/glue, which every run finds per task; docs/data.md): all of them or, interrupted while
writing, none (each file whole); the files already there are kept as they are. Each model goes
into the Hugging Face cache (HF_HOME, or ~/.cache/huggingface): its config, tokenizer and
weights, which a run finds there offline. A line per item says where it went.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from kit.config.paths import input_path
from kit.config.run_config import ConfigError
from kit.config.tasks import GLUE_TASKS, canonical_task_name
from kit.data import hub
from kit.data.pipeline import PROJECT_GLUE
from kit.data.readers import DataError, lacking, missing_files

# what a model needs to train and be read offline; TF / Flax / ONNX weights are left on the hub
MODEL_FILES = ["*.json", "*.txt", "*.model", "*.safetensors", "vocab*", "merges*", "spiece*",
               "sentencepiece*", "tokenizer*"]


def glue_task(name: str):
    try:
        task = GLUE_TASKS.get(canonical_task_name(name))
    except ValueError as err:
        raise ConfigError(f"fetch {name!r}: {err}") from None
    if task is None:
        raise ConfigError(f"fetch {name!r}: not a GLUE task; choose from {', '.join(GLUE_TASKS)}")
    return task


def needs_hub(what: str, hub_reason) -> None:
    """One line, where fetching `what` needs the hub and the hub does not answer."""
    if (reason := hub_reason()) is not None:
        raise OSError(f"fetching {what} needs the Hugging Face hub, which is unreachable "
                      f"({reason}): fetch runs where there is a network (a login node), into "
                      "a folder and HF_HOME the compute nodes share")


def fetch_glue(task, folder: Path, hub_reason, load=None) -> str:
    """The files of `task` that folder/<TASK>/ lacks, from the hub (kit.data.hub.fetch_task);
    the line that says what was written, or kept. The hub is asked only for a task that lacks
    files: a task there whole is kept offline too."""
    lack = missing_files(folder, task)
    if not lack:
        return (f"{task.name}: kept, its GLUE files are already in {folder / task.name} (delete "
                "that folder to fetch it again)")
    needs_hub(f"{task.name} ({lacking(lack)})", hub_reason)
    rows = hub.fetch_task(task, folder, load) or {}
    kept = [f"{s}.tsv" for s in task.splits() if s not in rows]
    return (f"{task.name}: {', '.join(f'{s} {n}' for s, n in rows.items())} rows -> "
            f"{folder / task.name}" + (f" (its {', '.join(kept)} kept)" if kept else ""))


def fetch_model(model: str, download=None) -> Path:
    """The model's files into the Hugging Face cache (`download`: snapshot_download); its
    folder there. PyTorch .bin weights only where the model has no safetensors."""
    if download is None:
        from huggingface_hub import snapshot_download as download
    try:
        folder = Path(download(model, allow_patterns=MODEL_FILES))
        if not any(folder.glob("*.safetensors")):
            folder = Path(download(model, allow_patterns=[*MODEL_FILES, "*.bin"]))
    except Exception as err:   # network, auth, no such model: one line
        raise OSError(f"model {model!r}: the hub did not give it ({type(err).__name__}: "
                      f"{str(err).strip().splitlines()[0] if str(err).strip() else ''})") from None
    return folder


def main(argv: list[str] | None = None, load=None, download=None) -> int:
    parser = argparse.ArgumentParser(prog="./run_all.sh fetch", description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="*", metavar="TASK", help="GLUE tasks (RTE, MRPC ...)")
    parser.add_argument("--model", action="append", default=[], metavar="ID",
                        help="a hub model id, e.g. bert-base-uncased (repeatable)")
    parser.add_argument("--glue-dir", default=str(PROJECT_GLUE), metavar="DIR",
                        help="where the GLUE files go (default: the project's data/glue)")
    args = parser.parse_args(argv)
    if not args.tasks and not args.model:
        parser.error("name a GLUE task or a --model ID to fetch")
    hub_reason = functools.cache(hub.hub_unreachable)   # asked once, and only if needed
    try:
        tasks = [glue_task(name) for name in args.tasks]
        folder = input_path(args.glue_dir)
        for task in tasks:
            print(fetch_glue(task, folder, hub_reason, load), flush=True)
        if args.model:
            needs_hub("the models", hub_reason)
        for model in args.model:
            where = fetch_model(model, download)
            home = os.environ.get("HF_HOME", "~/.cache/huggingface")
            print(f"{model} -> {where} (the Hugging Face cache, HF_HOME={home}; runs find it "
                  "there with HF_HUB_OFFLINE=1)", flush=True)
    except (ConfigError, DataError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""On a machine with a network (a cluster's login node): GLUE tasks and models fetched for runs
that have none (compute nodes with HF_HUB_OFFLINE=1).

    ./run_all.sh fetch [TASK ...] [--model ID ...] [--glue-dir DIR]

Each GLUE task's every split (train, dev, test) from the hub's copy (nyu-mll/glue) is written as
the GLUE files kit.data.readers reads, into DIR/<TASK>/ (default: the project's data/glue, which
every run finds per task; docs/data.md). Each model goes into the Hugging Face cache (HF_HOME, or
~/.cache/huggingface): its config, tokenizer and weights, which a run finds there offline. A line
per item says where it went.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kit.config.paths import input_path
from kit.config.run_config import ConfigError
from kit.config.tasks import GLUE_TASKS, canonical_task_name
from kit.data import hub
from kit.data.pipeline import PROJECT_GLUE
from kit.data.readers import DataError

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
    try:
        tasks = [glue_task(name) for name in args.tasks]
        if (reason := hub.hub_unreachable()) is not None:
            raise OSError(f"the Hugging Face hub is unreachable ({reason}): fetch runs where "
                          "there is a network (a login node), into a folder and HF_HOME the "
                          "compute nodes share")
        folder = input_path(args.glue_dir)
        for task in tasks:
            rows = hub.fetch_task(task, folder, load)
            if rows is None:
                print(f"{task.name}: kept, its GLUE files are already in {folder / task.name} "
                      "(delete that folder to fetch it again)", flush=True)
                continue
            print(f"{task.name}: {', '.join(f'{s} {n}' for s, n in rows.items())} rows -> "
                  f"{folder / task.name}", flush=True)
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

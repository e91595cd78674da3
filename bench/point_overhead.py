"""What a grid point pays outside the model: kernel start, imports, tokenization.

Every profile point is a fresh papermill kernel that imports the kit, transformers and the
model again and tokenizes its data again. Each part is measured in fresh processes, --repeats
times, alternated:

    kernel       start an ipykernel (the one papermill starts) until it answers, then stop it
    imports      a fresh interpreter: import kit.train.finetune and kit.results.views.run_view
                 (what finetune.ipynb imports), accelerate, and load the model with its tokenizer (load_backbone)
    tokenize     read the task's train + dev split and encode them, no cache
    cached       the same with the token cache (kit.data.token_cache.token_cache_dir), warm: what
                 the second and later points of a grid pay

    python bench/point_overhead.py --task SST-2 --json outputs/bench/point_overhead_sst2.json
"""
from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

IMPORTS = ("import kit.train.finetune, kit.results.views.run_view, accelerate; from kit.models.backbones import load_backbone; "
           "load_backbone({model!r})")
TOKENIZE = ("from kit.config.run_config import RunConfig; from kit.data.pipeline import encode, load_task_data; "
            "from kit.data.token_cache import token_cache_dir; from kit.models.backbones import load_tokenizer; "
            "cfg = RunConfig(task={task!r}, max_train_examples={max_train}); "
            "data = load_task_data(cfg); tok = load_tokenizer({model!r}); "
            "import time; t0, c0 = time.perf_counter(), time.process_time(); "
            "[encode(tok, s, {max_length}, data.task.regression, cache_dir={cache!r}) "
            "for s in [data.train, *data.dev.values()]]; "
            "print('TOKENIZE_S', time.perf_counter() - t0, time.process_time() - c0)")


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = common.parse(parser, {"task": "RTE"})
    common.check_environment()
    meta = common.print_header("Per-point overhead")
    with tempfile.TemporaryDirectory() as cache:
        warm_up = tokenize(args, cache)[0]            # fills the cache the `cached` rows read
        results = {"kernel": [], "imports": [], "tokenize": [], "cached": []}
        for _ in range(args.repeats):
            results["kernel"].append(kernel_start())
            results["imports"].append(timed([sys.executable, "-c",
                                             IMPORTS.format(model=args.model)]))
            results["tokenize"].append(tokenize(args, None))
            results["cached"].append(tokenize(args, cache))
    rows = [[name, *(f"{w:.1f} / {'-' if c is None else f'{c:.1f}'}" for w, c in got),
             round(min(w for w, _ in got), 2)] for name, got in results.items()]
    print(f"\n{args.task}, {args.max_train or 'all'} train rows + dev, max length "
          f"{args.max_length}, model {args.model}; wall / CPU seconds (tokenize, cached: "
          f"encode only; imports: the whole process)\n")
    print(common.markdown_table(["part", *(f"run {i + 1}" for i in range(args.repeats)),
                                 "min wall"], rows))
    best = {k: min(w for w, _ in v) for k, v in results.items()}
    fixed = best["kernel"] + best["imports"]
    print(f"\nper point, min of runs: uncached {fixed + best['tokenize']:.1f} s, with a warm "
          f"token cache {fixed + best['cached']:.1f} s "
          f"(first point fills the cache: {warm_up:.1f} s of tokenizing and writing)")
    common.dump_json(args.json, {**meta, "settings": vars(args), "seconds": results,
                                 "cache_fill_s": warm_up})


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a child process; CPU time moves less than wall on a busy machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=common.REPO, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (time.perf_counter() - t0,
            after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def tokenize(args, cache: str | None) -> tuple[float, float]:
    """(wall, CPU) seconds of encode() for the task's train + dev splits in a fresh process."""
    code = TOKENIZE.format(task=args.task, max_train=args.max_train, model=args.model,
                           max_length=args.max_length, cache=cache)
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=common.REPO,
                         capture_output=True, text=True).stdout
    wall, cpu = out.split("TOKENIZE_S")[-1].split()
    return float(wall), float(cpu)


def kernel_start() -> tuple[float, None]:
    """Seconds from starting a python3 kernel to its first answer (papermill's kernel start);
    its CPU time is the kernel process's, not measured."""
    from jupyter_client.manager import start_new_kernel
    t0 = time.perf_counter()
    manager, client = start_new_kernel(kernel_name="python3")
    elapsed = time.perf_counter() - t0
    client.stop_channels()
    manager.shutdown_kernel(now=True)
    return elapsed, None


if __name__ == "__main__":
    main()

"""The kit's module graph: no import cycle, counting imports inside functions too (a lazy
import must not hide a cycle); each layer imports only the layers below it
(docs/reference/architecture.md); the outputs contract and the loop have one home each, each
method's code its file."""
import ast
import json
import re
from dataclasses import replace
from pathlib import Path

KIT = Path(__file__).resolve().parents[1] / "kit"


def kit_imports(path: Path) -> set[str]:
    """The kit modules `path` imports anywhere in its body (`from kit import x` counts kit.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kit.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "kit" or node.module.startswith("kit."):   # from kit.train import loop
                found |= {f"{node.module}.{a.name}" for a in node.names}
            if node.module.startswith("kit."):
                found.add(node.module)
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(KIT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in KIT.rglob("*.py") if module_name(p) != "kit"}
    return {name: kit_imports(path) & set(modules) - {name} for name, path in modules.items()}


def test_the_import_graph_of_kit_is_acyclic():
    edges, state, cycles = graph(), {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles


def test_the_graph_reader_sees_function_level_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom kit import runs\n\ndef f():\n"
                    "    from kit.train.loop import run\n    import kit.data.pipeline\n")
    assert kit_imports(path) & set(graph()) == {"kit.runs", "kit.train.loop", "kit.data.pipeline"}


# The outputs contract has one owner, a module or a package (its modules are its readers and
# writers); kit.models.model_io's config.json is a checkpoint's, not a run's.
OUTPUTS_OWNER = "kit.runs"
CHECKPOINT_LAYOUT = "kit.models.model_io"
LOOP_STEP = "kit.train.step"          # the one optimizer.step() (the doctor's probe times it too)
TOUCHES_RUN_FILE = re.compile(
    r'"(metrics|config)\.json"\)?\.(read_text|write_text)|write_json\([^)]*"(metrics|config)\.json"'
    r'|read_csv\([^)]*history|"history\.csv"\)\.(read|write)|/ "history\.csv", ')


def owned_by(module: str, owner: str) -> bool:
    return module == owner or module.startswith(owner + ".")


def test_one_training_loop_and_one_owner_of_run_folders():
    """Only the loop's step steps an optimizer; only the outputs contract's owner writes or
    parses a run's metrics.json, config.json and history.csv."""
    modules = {module_name(p): p.read_text() for p in KIT.rglob("*.py")}
    assert [m for m, text in modules.items() if "optimizer.step()" in text] == [LOOP_STEP]
    writers = {m for m, text in modules.items() if TOUCHES_RUN_FILE.search(text)}
    assert any(owned_by(m, OUTPUTS_OWNER) for m in writers)       # the rule sees the owner's
    assert {m for m in writers if not owned_by(m, OUTPUTS_OWNER)} <= {CHECKPOINT_LAYOUT}


def test_the_graph_includes_the_method_registry():
    edges = graph()
    assert "kit.methods" in edges["kit.config.run_config"]
    assert edges["kit.methods"] == set()                 # data only: no kit module below it


def test_method_names_are_tested_only_in_the_registry():
    """Everything asks kit.methods (flags, labels, colours) instead of testing a method's name
    (the paper's table rows in paper_results name the paper's methods, which is their data)."""
    pattern = re.compile(r'method\s*(==|!=|in|not in)\s*\(?"(bert|bert-mask|ssa-co|ssa-h|embert|gated)"')
    hits = [f"{p.name}: {m.group(0)}" for p in KIT.rglob("*.py")
            for m in pattern.finditer(p.read_text())]
    assert not hits


def test_results_modules_read_run_folders_through_kit_runs():
    """Tables and figures never name a run's files: a path segment such as "metrics.json" or
    "predictions" as a string of its own (messages may mention them) is kit.runs' alone."""
    run_files = {"config.json", "metrics.json", "history.csv", "predictions", "checkpoint",
                 "dev.tsv", "head_spec.json", "runs"}
    results = sorted((KIT / "results").rglob("*.py"))         # every module, however nested
    assert len(results) > 20
    hits = []
    for path in results:
        tree = ast.parse(path.read_text())
        strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
        # "runs" is a word too (a zip's name): it counts where it is joined into a path
        named = (strings & run_files - {"runs"}) | (set(_path_segments(tree)) & {"runs"})
        hits += [f"{path.relative_to(KIT)}: {value!r}" for value in sorted(named)]
    assert not hits


def _path_segments(tree: ast.AST):
    """The strings a module joins into paths: either side of `/`, the arguments of Path(...),
    joinpath(...), os.path.join(...)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.left, node.right]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(
                node.func, "attr", "")) in ("Path", "joinpath", "PurePath", "join"):
            parts = node.args
        else:
            continue
        yield from (p.value for p in parts if isinstance(p, ast.Constant))


# -------------------------------------------- the layers (docs/reference/architecture.md)
# Each layer imports only the layers below it (and its own package). The method registry's table
# (kit/methods/__init__.py) is data with no kit import: it sits at the bottom and every layer may
# read it; the methods' code files beside it are layer 5. kit.cluster (kernels, signals, a
# point, SLURM's script) is what the doors are made of.
LAYERS = {"kit.io": 0, "registry": 0, "kit.config": 1, "kit.runs": 2, "kit.data": 3,
          "kit.models": 4, "kit.methods": 5, "kit.train": 6, "kit.results": 7, "kit.cluster": 8,
          "doors": 9}
LINES_MAX = 350


def layer(module: str) -> str:
    """The layer of a kit module, by a rule: its subpackage (each one named in LAYERS), a flat
    module named in LAYERS (a contract every layer shares: kit.io), or else a door (any other
    flat module: what a user types, kit.batch, kit.run ...)."""
    if module == "kit.methods":
        return "registry"
    top = ".".join(module.split(".")[:2])
    package = (KIT / top.removeprefix("kit.") / "__init__.py").exists()
    return top if package or top in LAYERS else "doors"


def test_every_kit_module_has_a_layer():
    unplaced = [m for m in graph() if layer(m) not in LAYERS]
    assert not unplaced, f"give these a layer (docs/reference/architecture.md, LAYERS): {unplaced}"


def test_new_flat_modules_are_doors_and_every_subpackage_has_a_layer():
    assert layer("kit.batch") == layer("kit.anything_new") == "doors"
    assert layer("kit.io") == "kit.io" and layer("kit.runs.lifecycle") == "kit.runs"
    packages = {f"kit.{p.parent.name}" for p in KIT.glob("*/__init__.py")}
    assert packages - set(LAYERS) == set(), "give each subpackage a layer in LAYERS"


def test_each_layer_imports_only_the_layers_below_it():
    upward = [f"{module} ({layer(module)}) imports {other} ({layer(other)})"
              for module, imported in graph().items() for other in imported
              if layer(other) != layer(module) and LAYERS[layer(other)] >= LAYERS[layer(module)]]
    assert not upward


def test_the_shape_of_kit():
    """No module over LINES_MAX lines; a subpackage's __init__ is its docstring, but the
    registry's table (kit.methods' own) and the outputs contract's names, when its owner is a
    package (`from kit.runs import X` reaches its readers' and writers' X, listed in __all__)."""
    long = {str(p.relative_to(KIT)): n for p in KIT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LINES_MAX}
    assert not long
    for init in KIT.rglob("*/__init__.py"):                # kit.results' rooms too
        name, tree = module_name(init), ast.parse(init.read_text())
        assert ast.get_docstring(tree), name
        if name == OUTPUTS_OWNER:
            assert all(isinstance(node, ast.ImportFrom) and owned_by(node.module, name)
                       or isinstance(node, ast.Assign) and node.targets[0].id == "__all__"
                       for node in tree.body[1:]), f"{name}: its own modules' names only"
        elif name != "kit.methods":
            assert len(tree.body) == 1, f"{init.relative_to(KIT)}: a docstring only"


# kit.results' rooms, by what the reader gets (kit/results/__init__.py): each imports only the
# rooms before it here, so the flow is one-way: the frame feeds tables, figures draw from both,
# the notebooks' views and the report sit on top.
RESULTS_ROOMS = ("frame", "tables", "figures", "views", "report")


def room(module: str) -> int | None:
    parts = module.split(".")
    return RESULTS_ROOMS.index(parts[2]) if parts[:2] == ["kit", "results"] and len(parts) > 2 \
        and parts[2] in RESULTS_ROOMS else None


def test_kit_results_is_in_rooms_that_import_one_way():
    modules = [m for m in graph() if m.startswith("kit.results.")]
    assert modules and all(room(m) is not None for m in modules), \
        f"put each module of kit.results in a room (RESULTS_ROOMS): {modules}"
    assert {p.name for p in (KIT / "results").iterdir() if p.suffix == ".py"} == {"__init__.py"}
    upward = [f"{module} imports {other}" for module, imported in graph().items()
              if room(module) is not None for other in imported
              if room(other) is not None and room(other) > room(module)]
    assert not upward


def test_a_run_stops_on_signals_and_exits_with_a_status_of_one_home():
    """The signals a run notes, a batch passes on and a kernel ignores outside fit(), and the
    exit status a job script requeues on: kit.train.preemption's, named nowhere else."""
    home = "kit.train.preemption"
    named = {module_name(p): p.read_text() for p in KIT.rglob("*.py")}
    assert [m for m, text in named.items() if re.search(r"signal\.SIG(TERM|USR1|INT)\b", text)
            ] == [home]
    assert [m for m, text in named.items()
            if re.search(r"^PREEMPTED_EXIT\s*=", text, re.M)] == [home]


def test_each_method_file_is_code_not_a_stub():
    stubs = [p.name for p in (KIT / "methods").glob("*.py")
             if p.name != "__init__.py" and len(p.read_text().splitlines()) < 25]
    assert not stubs


def test_the_worked_example_of_a_new_method_runs(monkeypatch):
    """docs/new-method.md's 20-line method, as written there (its file, its registry row, its
    EPOCHS line), makes a method whose epoch is the training set plus shuffled copies."""
    import numpy as np

    from kit import methods
    from kit.config.run_config import RunConfig
    from kit.data.pipeline import Examples
    from kit.methods import epochs
    from kit.methods.ssa import SSASettings

    doc = (KIT.parent / "docs" / "new-method.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    code = next(b for b in blocks if b.startswith("# kit/methods/shuffled.py"))
    module = {}
    exec(compile(code, "kit/methods/shuffled.py", "exec"), module)
    row = next(b for b in blocks if '"shuffled-copies"' in b and "Method(" in b)
    method = eval(re.search(r"Method\(.*\)", row)[0], {"Method": methods.Method})
    kind = re.search(r'^\s*"([\w-]+)": (\w+),', row, re.M)
    monkeypatch.setitem(methods.REGISTRY, method.name, method)
    monkeypatch.setitem(epochs.EPOCHS, kind[1], module[kind[2]])

    rows = [np.array([101, 5, 6, 7, 8, 102]), np.array([101, 9, 10, 102, 11, 102])]
    train = Examples(rows, None, [np.isin(r, [101, 102]) for r in rows], np.array([0, 1]))
    settings = replace(SSASettings.from_config(RunConfig()), method=method.name)
    epoch_set, stats = epochs.build_epoch(train, settings, 1, None, False, 103)
    assert stats == {"epoch": 1, "shuffled": 2} and len(epoch_set) == 4
    for original, copy in zip(rows, epoch_set.input_ids[2:]):
        special = np.isin(original, [101, 102])
        assert (copy[special] == original[special]).all()
        assert sorted(copy[~special]) == sorted(original[~special])


def test_a_precision_is_named_in_one_place(monkeypatch):
    """What `mixed_precision: no` is called (fp32) is written once, kit.config.rules.
    PRECISION_NAMES: the report's header and a checkpoint's hardware line both read it."""
    import re
    from kit.config import rules
    from kit.results.report import page_header
    spelled = [path for path in sorted(KIT.rglob("*.py"))
               if re.search(r"""["']no["']\s*:\s*["']fp32["']""", path.read_text())]
    assert spelled == [KIT / "config" / "rules.py"]
    from kit.train.checkpoint_hardware import describe
    monkeypatch.setitem(rules.PRECISION_NAMES, "no", "float32")
    assert describe({"precision": "no", "device": "cpu", "processes": 1}) == "float32 on cpu x1"
    metrics = {"mixed_precision": "no", "device": "cpu", "environment": {}}
    done = [page_header.GridRun("r", Path("r"), {}, "ok", metrics)]
    assert page_header.provenance(done)["precision"] == "float32 on cpu"


# ---------------------------------------------------------- one import path per name
# A name has one import path: the module that defines it, or a package whose __init__ lists it
# in __all__ (kit.runs: the outputs contract's API). So a kit module imports another kit module's
# name only to use it (no re-export shims), nobody imports a name from a module that merely
# imports it, and the kit's own code does not read one as `module.name` either. (Tests may: that
# is how they patch the name where a module looks it up.)
ROOT = KIT.parent


def _top_level(body):
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for part in (node.body, node.orelse, getattr(node, "finalbody", []),
                         *[h.body for h in getattr(node, "handlers", [])]):
                yield from _top_level(part)


def bindings(tree: ast.Module) -> tuple[set, set, set]:
    """(names a module binds itself, names it imports from other kit modules, its __all__)."""
    own, imported, api = set(), set(), set()
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if any(getattr(t, "id", "") == "__all__" for t in targets):
                api = set(ast.literal_eval(node.value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            kit = isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kit"
            names = {a.asname or a.name.split(".")[0] for a in node.names}
            (imported if kit else own).update(names)
    return own, imported, api


def import_paths():
    """Every file that imports kit names (kit, tests, bench, the notebooks' code) as
    (where, tree); notebook cells without their IPython magics."""
    for folder in ("kit", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text())
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            lines = "".join(cell["source"]).splitlines() if cell["cell_type"] == "code" else []
            code = "\n".join(l for l in lines if not l.lstrip().startswith(("%", "!")))
            yield f"{path.relative_to(ROOT)} cell {i}", ast.parse(code)


def second_paths() -> list[str]:
    modules = {module_name(p): ast.parse(p.read_text()) for p in KIT.rglob("*.py")}
    scopes = {m: bindings(tree) for m, tree in modules.items()}
    api = {(m, n) for m, (_, _, names) in scopes.items() for n in names}

    def elsewhere(module: str, name: str, importer: str) -> bool:
        """`module.name` is not the name's one path, for a file in `importer`."""
        if module not in scopes or f"{module}.{name}" in modules or (module, name) in api:
            return False
        home = next((p for p, n in api if n == name and module.startswith(p + ".")), None)
        if home is not None and not importer.startswith(home.replace(".", "/")):
            return True                        # through its package's API only, from outside
        return name in scopes[module][1]

    hits = []
    for where, tree in import_paths():
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kit"):
                for a in node.names:
                    if elsewhere(node.module, a.name, where):
                        hits.append(f"{where}:{node.lineno}: from {node.module} import {a.name}")
                    if f"{node.module}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname})
        if where.startswith("kit/"):
            hits += [f"{where}:{n.lineno}: {aliases[n.value.id]}.{n.attr}" for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                     and n.value.id in aliases and elsewhere(aliases[n.value.id], n.attr, where)]
    for m, tree in modules.items():
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        own, imported, names = scopes[m]
        hits += [f"{m} imports {n} only to pass it on" for n in sorted(imported - used - names)]
    return hits


def test_a_name_has_one_import_path():
    assert not second_paths()


def test_the_import_path_rule_sees_shims_and_second_paths(tmp_path, monkeypatch):
    fake = tmp_path / "kit"
    (fake / "train").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "train" / "__init__.py").write_text("")
    (fake / "train" / "window.py").write_text("class NonFiniteLoss(Exception):\n    pass\n")
    (fake / "train" / "loop.py").write_text("from kit.train.window import NonFiniteLoss\n")
    (fake / "train" / "job.py").write_text("from kit.train import loop\nx = loop.NonFiniteLoss\n"
                                           "from kit.train.loop import NonFiniteLoss as N\ny = N\n")
    for folder in ("tests", "bench", "notebooks"):
        (tmp_path / folder).mkdir()
    monkeypatch.setattr(__import__(__name__), "KIT", fake)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert sorted(second_paths()) == [
        "kit.train.loop imports NonFiniteLoss only to pass it on",
        "kit/train/job.py:2: kit.train.loop.NonFiniteLoss",
        "kit/train/job.py:3: from kit.train.loop import NonFiniteLoss"]

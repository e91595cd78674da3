"""The kit's module graph: no import cycle, counting imports inside functions too (a lazy
import must not hide a cycle); the outputs contract and the loop have one home each."""
import ast
import re
from pathlib import Path

KIT = Path(__file__).resolve().parents[1] / "kit"


def kit_imports(path: Path) -> set[str]:
    """The kit modules `path` imports anywhere in its body (`from kit import x` counts kit.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kit.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "kit" or node.module.startswith("kit."):   # `from kit.train import loop`
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
    path.write_text("import os\nfrom kit import runs\n\ndef f():\n    from kit.train.loop import run\n"
                    "    import kit.data.pipeline\n")
    assert kit_imports(path) & set(graph()) == {"kit.runs", "kit.train.loop", "kit.data.pipeline"}


def test_one_training_loop_and_one_owner_of_run_folders():
    """Only kit.train.loop steps an optimizer; only kit.runs writes or parses a run's metrics.json,
    config.json and history.csv (kit.models.model_io's config.json is a checkpoint's, not a run's)."""
    touches_run_file = re.compile(
        r'"(metrics|config)\.json"\)?\.(read_text|write_text)|write_json\([^)]*"(metrics|config)\.json"'
        r'|read_csv\([^)]*history|"history\.csv"\)\.(read|write)|/ "history\.csv", ')
    for path in KIT.rglob("*.py"):
        text = path.read_text()
        if path.stem != "loop":
            assert "optimizer.step()" not in text, path.name
        if path.stem not in ("runs", "model_io"):
            assert not touches_run_file.search(text), (path.name, touches_run_file.search(text))


def test_the_graph_includes_the_method_registry():
    edges = graph()
    assert "kit.methods" in edges["kit.config.run_config"]
    assert edges["kit.methods"] == set()                 # data only: no kit module below it


def test_method_names_are_tested_only_in_the_registry():
    """Everything asks kit.methods (flags, labels, colours) instead of testing a method's name
    (the paper's table rows in paper_results name the paper's methods, which is their data)."""
    pattern = re.compile(r'method\s*(==|!=|in|not in)\s*\(?"(bert|bert-mask|ssa-co|ssa-h|embert|gated)"')
    hits = [f"{p.name}: {m.group(0)}" for p in KIT.rglob("*.py") for m in pattern.finditer(p.read_text())]
    assert not hits


def test_results_modules_read_run_folders_through_kit_runs():
    """Tables and figures never name a run's files: a path segment such as "metrics.json" or
    "predictions" as a string of its own (messages may mention them) is kit.runs' alone."""
    run_files = {"config.json", "metrics.json", "history.csv", "predictions", "checkpoint",
                 "dev.tsv", "head_spec.json", "runs"}
    results = ("report", "tables", "paper_table", "selection", "fold_tables", "table_sets",
               "writers", "figure_data", "token_view", "figures", "mechanism")
    hits = [f"{name}.py: {node.value!r}" for name in results
            for node in ast.walk(ast.parse((KIT / "results" / f"{name}.py").read_text()))
            if isinstance(node, ast.Constant) and node.value in run_files]
    assert not hits

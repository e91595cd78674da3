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
            if node.module == "kit":
                found |= {f"kit.{a.name}" for a in node.names}
            elif node.module.startswith("kit."):
                found.add(node.module)
    return found


def graph() -> dict[str, set[str]]:
    modules = {f"kit.{p.stem}": p for p in KIT.glob("*.py") if p.stem != "__init__"}
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
    path.write_text("import os\nfrom kit import runs\n\ndef f():\n    from kit.loop import run\n"
                    "    import kit.data\n")
    assert kit_imports(path) == {"kit.runs", "kit.loop", "kit.data"}


def test_one_training_loop_and_one_owner_of_run_folders():
    """Only kit.loop steps an optimizer; only kit.runs writes or parses a run's metrics.json,
    config.json and history.csv (kit.models' config.json is a checkpoint's, not a run's)."""
    touches_run_file = re.compile(
        r'"(metrics|config)\.json"\)?\.(read_text|write_text)|write_json\([^)]*"(metrics|config)\.json"'
        r'|read_csv\([^)]*history|"history\.csv"\)\.(read|write)|/ "history\.csv", ')
    for path in KIT.glob("*.py"):
        text = path.read_text()
        if path.stem != "loop":
            assert "optimizer.step()" not in text, path.name
        if path.stem not in ("runs", "models"):
            assert not touches_run_file.search(text), (path.name, touches_run_file.search(text))

"""What a notebook asked for: its `# parameters` cell and the cell papermill injects after it.

`RunConfig.from_namespace(globals())` builds a notebook's config. Taking every global whose name
is a RunConfig field would also take a variable that a later cell names like one (`fold = 3` in
a loop over folds would silently change the next run). Where IPython's input history is in the
namespace (`In`: every notebook kernel has it, under JupyterLab, papermill and the batch's warm
kernel, whose %reset between points keeps the history), the config is read from exactly:

- the latest executed cell whose first line starts with `# parameters` (the notebook's own
  cell, tagged `parameters`), and
- papermill's injected cells (first line `# Parameters`) executed after it,

in the order they ran. A value is the literal the cell assigns (`ast.literal_eval`, so nothing
runs twice); an assignment that is no literal (`lr = 2 * base`) takes the value the namespace
holds. A namespace without that history (a plain script's globals) gives None: the caller takes
the namespace's own values.
"""
from __future__ import annotations

import ast
from collections.abc import Collection

OWN = "# parameters"          # the first line of a notebook's parameters cell
INJECTED = "# Parameters"     # the first line of papermill's injected cell
PLAIN = (str, int, float, bool, list, tuple, type(None))   # what a parameter's value looks like


def parameter_cells(history) -> list[str] | None:
    """The sources of the latest `# parameters` cell and the injected cells run after it, in
    the order they ran; None when the history holds no parameters cell."""
    injected = []
    for source in reversed(history if isinstance(history, list) else []):
        first = source.lstrip().partition("\n")[0].rstrip() if isinstance(source, str) else ""
        if first == INJECTED:
            injected.append(source)
        elif first.startswith(OWN):
            return [source, *reversed(injected)]
    return None


def assignments(source: str, namespace: dict) -> dict:
    """`name = value` at the top level of a cell's source: the literal, else the namespace's
    value of that name. A SyntaxError propagates."""
    values = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in (t for t in targets if isinstance(t, ast.Name)):
            try:
                values[target.id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                if target.id in namespace:
                    values[target.id] = namespace[target.id]
    return values


def cell_parameters(namespace: dict, fields: Collection[str]) -> dict | None:
    """The parameters the notebook's cells assign (see the module docstring), or None without
    IPython's input history. A field set elsewhere in the notebook to another plain value is
    named in one printed line: it is not used."""
    cells = parameter_cells(namespace.get("In"))
    if cells is None:
        return None
    try:
        values = {}
        for source in cells:
            values.update(assignments(source, namespace))
    except SyntaxError:                    # not Python (a cell IPython could not transform)
        return None
    elsewhere = sorted(name for name in fields
                       if name in namespace and isinstance(namespace[name], PLAIN)
                       and _differs(namespace[name], values.get(name, _UNSET)))
    if elsewhere:
        print(f"note: {', '.join(elsewhere)} set outside the parameters cell: not used (the "
              "config is the parameters cell and papermill's parameters; change it there)")
    return values


_UNSET = object()


def _differs(a, b) -> bool:
    """Whether two parameter values differ (a list and a tuple of the same items do not)."""
    if b is _UNSET:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) != list(b)
    return type(a) is not type(b) and not {type(a), type(b)} <= {int, float} or a != b

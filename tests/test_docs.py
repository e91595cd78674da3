"""The docs checker: every profile, notebook, subcommand, flag, parameter name, file, dotted kit
name and relative link (file and anchor) that the docs name exists.

What exists is read from the code, never listed here: run_all.sh's `case` branches (its
subcommands, and the module or script each one runs), the argparse calls of kit.batch, kit.run,
kit.slurm, kit.predict, kit.doctor and bench/*.py (read with `ast`, so a flag added to a parser is
known at once), pytest's options in tests/conftest.py, RunConfig's fields, PROFILE_KEYS, the
parameters cells of notebooks/, params/*.yaml and the files of the checkout. The docs are
README.md, RESULTS.md, docs/*.md, docs/reference/*.md, bench/README.md, the notebooks' markdown
cells and run_all.sh's usage text and header comment. Each check lists every problem of one doc
in one failure.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from kit.config.profiles import PROFILE_KEYS, YamlLoader
from kit.config.run_config import PARAMETER_ALIASES, RunConfig

ROOT = Path(__file__).resolve().parent.parent
FIELDS = {f.name for f in dataclasses.fields(RunConfig)}
PROFILES = {p.stem for p in (ROOT / "params").glob("*.yaml")}
NOTEBOOKS = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
# the project's own folders and files: a backticked path under them must exist (outputs/ and
# the user's own files are not the checkout's)
TRACKED = ("kit/", "params/", "notebooks/", "tests/", "bench/", "docs/", "data/glue/")
ROOT_FILES = ("run_all.sh", "pyproject.toml", "environment.yml", "README.md", "RESULTS.md")
# flags of other programs that the docs quote alone in prose (sbatch, torchrun, pip, CPython's
# configure): never the kit's, whose flags are read from its parsers
FOREIGN_FLAGS = {"--mem", "--qos", "--constraint", "--export", "--requeue", "--signal",
                 "--signals-to-handle", "--shutdown-timeout", "--python-version", "--platform",
                 "--enable-optimizations", "--enable-shared"}


# ---------------------------------------------------------------- what exists (from the code)

@cache
def parser_flags(path: Path) -> set[str]:
    """Every option string of the argparse `add_argument` calls in a Python file."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant)
                      and isinstance(a.value, str) and a.value.startswith("-")}
    return flags | {"-h", "--help"}


@cache
def kit_run_flags() -> set[str]:
    """kit.run takes every RunConfig field as --name (dashes or underscores) and its OPTIONS."""
    tree = ast.parse((ROOT / "kit/run.py").read_text())
    options = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", "") == "OPTIONS")
    names = FIELDS | set(options)
    return ({f"--{n}" for n in names} | {f"--{n.replace('_', '-')}" for n in names}
            | {"-h", "--help"})


@cache
def pytest_flags() -> set[str]:
    """The suite's own options (tests/conftest.py) and pytest's (its --help)."""
    own = set(re.findall(r'addoption\("(--[\w-]+)"', (ROOT / "tests/conftest.py").read_text()))
    text = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True,
                          text=True, cwd=ROOT).stdout
    return own | set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", text))


@cache
def module_flags(module: str) -> set[str]:
    if module == "kit.run":
        return kit_run_flags()
    if module == "pytest":
        return pytest_flags()
    path = ROOT / (module.replace(".", "/") + ".py")
    return parser_flags(path if path.exists() else path.with_suffix("") / "__main__.py")


@cache
def script_flags(script: str) -> set[str]:
    """A bench script's flags: its parser's, or for a shell script the flags it reads itself
    and those of the Python script it runs."""
    path = ROOT / script
    if path.suffix == ".py":
        return parser_flags(path) | parser_flags(ROOT / "bench/common.py")
    text = path.read_text()
    flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", text))
    for called in re.findall(r"(bench/\w+\.py)", text):
        flags |= script_flags(called)
    return flags


@cache
def run_all_commands() -> dict[str, set[str]]:
    """run_all.sh's subcommands (each name of each `case` branch; `*` is a profile) -> the flags
    that branch takes: those of the kit module or program it runs, or the ones it reads itself."""
    text = (ROOT / "run_all.sh").read_text()
    functions = dict(re.findall(r"^([\w-]+)\(\) \{\n(.*?)^\}", text, re.S | re.M))
    commands: dict[str, set[str]] = {}
    for names, body in re.findall(r"^\s+([^\s()#]+)\)(.*?);;", text, re.S | re.M):
        # a branch may call a shell function of the script: its body counts as the branch's
        body += "".join(functions[w] for w in re.findall(r"[\w-]+", body) if w in functions)
        flags = set().union(*(module_flags(m) for m in re.findall(r"-m ([\w.]+)", body)))
        flags |= set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", body))
        for name in names.split("|"):
            commands.setdefault(name, set()).update(flags)
    return commands


@cache
def notebook_parameters() -> set[str]:
    """Names the notebooks' parameters cells assign (a notebook's own knobs, e.g. `profile`)."""
    names = set()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                names |= set(re.findall(r"^(\w+)\s*=", "".join(cell["source"]), re.M))
    return names


# ---------------------------------------------------------------- the docs and their code

def usage_chunks() -> list[str]:
    """run_all.sh's usage entries as commands: an entry of the usage heredoc (`PROFILE [ARGS]
    the grid ... (--shard i/n ...)`) claims every flag it names for its command; an entry of the
    header comment (`./run_all.sh slurm PROFILE [--array N] ...   what it does`) claims the flags
    of its command part, and its description may name any flag of the kit's parsers."""
    text = (ROOT / "run_all.sh").read_text()
    usage = re.search(r"<<'USAGE'\n(.*?)\nUSAGE", text, re.S)[1]
    chunks = ["run_all.sh " + " ".join(entry.split()) for entry in
              re.findall(r"^  (?![(-])\S.*(?:\n {6,}\S.*)*", usage, re.M)]
    header = [line[1:] for line in text.split("\nset -euo")[0].splitlines() if line[:1] == "#"]
    for entry in re.findall(r"^ +\./run_all\.sh.*(?:\n {6,}(?!\./)\S.*)*", "\n".join(header),
                            re.M):
        command, _, description = re.sub(r"\s*\n\s*", " ", entry).strip().partition("  ")
        chunks += [command, "DESCRIPTION " + description]
    return chunks


def usage_text() -> str:
    """run_all.sh's header comment and its usage heredoc, as one doc."""
    text = (ROOT / "run_all.sh").read_text()
    header = "\n".join(line[1:] for line in text.splitlines()[1:] if line.startswith("#"))
    usage = re.search(r"<<'USAGE'\n(.*?)\nUSAGE", text, re.S)[1]
    return header.split("\nset -euo")[0] + "\n" + usage


def doc_text(name: str) -> str:
    if name == "run_all.sh":
        return usage_text()
    if name.endswith(".ipynb"):
        cells = json.loads((ROOT / name).read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return (ROOT / name).read_text()


DOCS = sorted(["README.md", "RESULTS.md", "bench/README.md", "run_all.sh",
               *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
               *(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "reference").glob("*.md")),
               *(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))])


def blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)


def spans(text: str) -> list[str]:
    """Inline code spans outside fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", prose)


def code_chunks(name: str) -> list[str]:
    """Every piece of code a doc shows: inline spans, fenced lines (a trailing `\\` joins the
    next), and for run_all.sh each usage entry with its continuation lines."""
    text = doc_text(name)
    if name == "run_all.sh":
        return usage_chunks()
    lines = [line for b in blocks(text) for line in b.replace("\\\n", " ").splitlines()]
    return spans(text) + lines


def tokens_after(chunk: str, start: int) -> list[str]:
    """The words of one command: up to a shell separator or a comment, brackets dropped."""
    words = []
    for word in chunk[start:].split():
        if word in ("&&", "||", ";", "|", "#") or word.startswith("#"):
            break
        words.append(word.strip("[](),;`'\""))
    return [w for w in words if w]


def flags_of(words: list[str]) -> list[str]:
    """The --flags among a command's words; a word after `--sbatch` is its value (an sbatch
    option the kit passes through), not a flag of the kit."""
    return [w.split("=")[0] for i, w in enumerate(words) if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)
            and not w.startswith("--sbatch=-") and (i == 0 or words[i - 1] != "--sbatch")]


# ---------------------------------------------------------------- checks (problems of one doc)

def command_problems(chunk: str) -> list[str]:
    """A `./run_all.sh ...`, `python -m kit.X ...` or `bench/X` command: its subcommand or
    profile, its flags and its name=value parameters exist."""
    if chunk.startswith("DESCRIPTION "):
        known = all_kit_flags() - (kit_run_flags() - parser_flags(ROOT / "kit/batch.py"))
        return [f"run_all.sh's usage: {f} is no option of any of its commands"
                for f in flags_of(chunk.split()) if f not in known]
    problems = []
    for m in re.finditer(r"run_all\.sh\b", chunk):
        words = tokens_after(chunk, m.end())
        commands = run_all_commands()
        head = words[0] if words else ""
        if not head or head in ("...", "COMMAND") or head.startswith("-") and head in commands:
            continue
        if head in commands:
            command = head
        elif head in PROFILES or head == "PROFILE" or head.startswith("my-"):   # my-*: yours
            command = "*"
        elif head.startswith("-") or re.fullmatch(r"[a-z][\w-]*", head):
            problems.append(f"`run_all.sh {head}`: no such subcommand of run_all.sh "
                            f"({', '.join(sorted(c for c in commands if c != '*'))}) and no "
                            "params/{head}.yaml".replace("{head}", head))
            continue
        else:
            continue
        unknown = [f for f in flags_of(words[1:]) if f not in commands[command]]
        problems += [f"`run_all.sh {head} ... {f}`: {f} is no option of run_all.sh "
                     f"{'PROFILE' if command == '*' else command}" for f in unknown]
        if command == "run":
            problems += name_value_problems(words[1:], f"run_all.sh {head}")
    for m in re.finditer(r"-m (kit(?:\.\w+)+)\b", chunk):
        words = tokens_after(chunk, m.end())
        path = ROOT / (m[1].replace(".", "/") + ".py")
        if not path.exists() and not (path.with_suffix("") / "__main__.py").exists():
            problems.append(f"`python -m {m[1]}`: no module {path.relative_to(ROOT)}")
            continue
        known = module_flags(m[1])
        problems += [f"`python -m {m[1]} ... {f}`: {f} is no option of {m[1]}"
                     for f in flags_of(words) if f not in known]
        if m[1] == "kit.run":
            problems += name_value_problems(words, "python -m kit.run")
    for m in re.finditer(r"(?<![\w/])(bench/[\w.]+\.(?:py|sh))\b", chunk):
        if not (ROOT / m[1]).exists():
            continue                            # the file check names it
        known = script_flags(m[1])
        problems += [f"`{m[1]} ... {f}`: {f} is no option of {m[1]}"
                     for f in flags_of(tokens_after(chunk, m.end())) if f not in known]
    for m in re.finditer(r"papermill\b", chunk):
        words = tokens_after(chunk, m.end())
        names = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-p"]
        known = FIELDS | notebook_parameters() | set(PARAMETER_ALIASES)
        problems += [f"`papermill ... -p {n}`: no RunConfig field or notebook parameter {n!r}"
                     for n in names if n not in known]
    return problems


def name_value_problems(words: list[str], where: str) -> list[str]:
    """`name=value` words name fields (`name` itself is the docs' placeholder; another tool's
    name for a field, PARAMETER_ALIASES, is shown being refused)."""
    names = [w.split("=")[0] for w in words if re.fullmatch(r"[a-z]\w*=.*", w)]
    return [f"`{where} {n}=...`: no RunConfig field {n!r}" for n in names
            if n not in FIELDS | set(PARAMETER_ALIASES) | {"name"}]


@cache
def all_kit_flags() -> set[str]:
    flags = set().union(*(module_flags(f"kit.{p.stem}") for p in (ROOT / "kit").glob("*.py")
                          if "add_argument" in p.read_text() or p.stem == "run"))
    bench = set().union(*(script_flags(str(p.relative_to(ROOT)))
                          for p in (ROOT / "bench").glob("*.[ps][yh]")))
    return flags | bench | set().union(*run_all_commands().values())


def bare_flag_problems(chunk: str) -> list[str]:
    """A span that is a flag on its own (`--per-device K`) names a flag some parser of the kit
    has (or another program's, FOREIGN_FLAGS)."""
    m = re.fullmatch(r"(--[a-z][\w-]*)(?:[ =].*)?", chunk.strip())
    if not m or m[1] in FOREIGN_FLAGS or m[1] in all_kit_flags():
        return []
    return [f"`{m[1]}`: no parser of the kit (kit.*, bench/*, run_all.sh) has this flag"]


def yaml_problems(block: str) -> list[str]:
    """A YAML block shaped as a profile: its keys are profile keys and its grid's are fields."""
    try:
        spec = yaml.load(block, Loader=YamlLoader)
    except yaml.YAMLError:
        return []
    if not isinstance(spec, dict) or not ({"grid", "task_overrides"} & set(spec)
                                          or set(spec) <= FIELDS):
        return []
    if "grid" not in spec and "task_overrides" not in spec:
        grids = [spec]                          # a bare grid
    else:
        grids = spec["grid"] if isinstance(spec.get("grid"), list) else [spec.get("grid") or {}]
        grids += list((spec.get("task_overrides") or {}).values())
        problems = [f"yaml: {k!r} is no profile key ({', '.join(sorted(PROFILE_KEYS))})"
                    for k in spec if k not in PROFILE_KEYS]
        if problems:
            return problems
    return [f"yaml: {k!r} is no RunConfig field" for g in grids for k in g if k not in FIELDS]


def parameter_span_problems(chunk: str) -> list[str]:
    """`name: value` spans that set a knob (a snake_case name with an underscore, as every
    multi-word field is spelled) name a RunConfig field or a profile key."""
    m = re.fullmatch(r"([a-z]+_[a-z0-9_]+): \S.*", chunk.strip())
    if not m or m[1] in FIELDS | PROFILE_KEYS | notebook_parameters() | written_keys():
        return []
    return [f"`{chunk}`: {m[1]!r} is no RunConfig field, profile key or key the kit writes"]


@cache
def written_keys() -> set[str]:
    """The string keys of the dict literals in kit/ (what metrics.json, config.json and a
    checkpoint's records hold: `best_epoch`, `kit_commit` ...)."""
    keys = set()
    for path in (ROOT / "kit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
    return keys


@cache
def module_names(path: Path) -> set[str]:
    """The top-level names a module defines or imports."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_problems(chunk: str) -> list[str]:
    """`kit.a.b` / `kit.a.b.name` (a call's arguments dropped) is a module of kit and, when a
    name follows, one that module defines."""
    problems = []
    for dotted in re.findall(r"(?<![\w./])(kit(?:\.\w+)+)", chunk):
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:n])
            module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if module.exists():
                break
        rest = parts[n:]
        if not module.exists() or rest and rest[0] not in module_names(module):
            problems.append(f"`{dotted}`: no such module or name in kit")
    return problems


def path_problems(chunk: str) -> list[str]:
    """A project path (kit/..., params/x.yaml, tests/x.py::name ...) exists; `::name` is a
    function or class of that file; a notebook named alone exists in notebooks/."""
    problems = []
    if re.fullmatch(r"[\w-]+\.ipynb", chunk.strip()):
        chunk = f"notebooks/{chunk.strip()}"
    for m in re.finditer(r"(?<![\w./<-])((?:[\w.-]+/)*[\w.-]+\.\w+(?:::[\w*]+)?)", chunk):
        if chunk[m.end():m.end() + 2] == ": ":
            continue                            # `file: problem`, an error message's example
        raw = m[1]
        path, _, name = raw.partition("::")
        if not (path.startswith(TRACKED) or path in ROOT_FILES):
            continue
        file = ROOT / path
        if re.fullmatch(r"[A-Z_]+|my-.*", file.stem):
            continue                            # the docs' placeholders: params/NAME.yaml, yours
        if not file.exists():
            problems.append(f"`{raw}`: no file {path}")
        elif name and not re.search(rf"^\s*(?:def|class) {name.replace('*', '.*')}\b",
                                    file.read_text(), re.M):
            problems.append(f"`{raw}`: {path} has no test or class matching {name}")
    return problems


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        out.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return out


def link_problems(name: str) -> list[str]:
    """Every relative markdown link's file exists, and its #anchor is a heading there."""
    problems, here = [], (ROOT / name).parent
    text = re.sub(r"^```.*?^```", "", doc_text(name), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue                                    # https:, mailto:
        file, _, anchor = target.partition("#")
        path = (here / file).resolve() if file else ROOT / name
        if not path.exists():
            problems.append(f"link {target}: no file {file}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"link {target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    return problems


def doc_problems(name: str) -> list[str]:
    text = doc_text(name)
    problems = link_problems(name)
    chunks = code_chunks(name)
    for chunk in chunks:
        problems += command_problems(chunk)
        problems += dotted_problems(chunk)
    for chunk in spans(text) if name != "run_all.sh" else []:
        problems += bare_flag_problems(chunk) + parameter_span_problems(chunk)
        problems += path_problems(chunk)
    for block in blocks(text):
        problems += yaml_problems(block)
    return list(dict.fromkeys(problems))


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_a_doc_gives_exists(doc):
    problems = doc_problems(doc)
    assert not problems, f"{doc}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------- what the docs must name

def test_every_profile_is_in_the_readmes_table():
    table = re.search(r"^## Profiles\n(.*?)^## ", doc_text("README.md"), re.S | re.M)[1]
    named = set(re.findall(r"^\| ((?:`[\w-]+`(?:, )?)+)[^|]*\|", table, re.M))
    names = {n for row in named for n in re.findall(r"`([\w-]+)`", row)}
    assert names - PROFILES == set(), "README's profile table names profiles params/ lacks"
    assert PROFILES - names == set(), "profiles in params/ missing from README's table"


def test_every_notebook_is_in_the_notebook_pages_table():
    rows = re.findall(r"^\| `([\w-]+)\.ipynb` \|", doc_text("docs/notebooks.md"), re.M)
    assert set(rows) == NOTEBOOKS


def test_every_subcommand_of_run_all_is_in_its_usage():
    usage = re.search(r"<<'USAGE'\n(.*?)\nUSAGE", (ROOT / "run_all.sh").read_text(), re.S)[1]
    entries = set(re.findall(r"^  (\w[\w-]*)", usage, re.M))
    commands = {c for c in run_all_commands() if re.fullmatch(r"\w[\w-]*", c)} - {"help"}
    assert commands - entries == set()


def test_every_flag_of_the_kits_commands_is_documented():
    """A flag added to kit.batch / kit.slurm / kit.doctor / kit.predict is named in some doc."""
    text = "\n".join(doc_text(d) for d in DOCS)
    missing = {m: sorted(f for f in module_flags(m) if f.startswith("--")
                         and not re.search(rf"{f}(?![\w-])", text))
               for m in ("kit.batch", "kit.slurm", "kit.doctor", "kit.predict")}
    assert not any(missing.values()), missing


def test_every_bench_entry_point_is_in_bench_readme():
    """Each script a person runs from bench/ (a .sh, or a .py with a __main__ that no other
    bench file runs as its child) is named in bench/README.md."""
    files = {p.name: p.read_text() for p in (ROOT / "bench").glob("*.[ps][yh]")}
    entries = {n for n, t in files.items() if n.endswith(".sh") or "__main__" in t}
    children = {n for n in entries if n.endswith(".py")
                and any(n in t for o, t in files.items() if o != n)}
    readme = doc_text("bench/README.md")
    assert sorted(n for n in entries - children if n not in readme) == []


def test_profiles_page_has_a_row_per_profile_key_and_errors_md_the_real_message(tmp_path):
    """docs/profiles.md's key table is PROFILE_KEYS; docs/reference/errors.md quotes the message
    the kit gives."""
    from kit.config.profiles import read_spec
    from kit.config.run_config import ConfigError
    table = re.search(r"^## The keys\n(.*?)^## ", doc_text("docs/profiles.md"), re.S | re.M)[1]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == PROFILE_KEYS
    path = tmp_path / "p.yaml"
    path.write_text("gird: {task: RTE}\n")
    with pytest.raises(ConfigError) as err:
        read_spec(path)
    message = str(err.value).replace(str(path), "params/p.yaml")
    assert f"`{message}`" in doc_text("docs/reference/errors.md")


def test_ssa_pages_equation_table_names_functions_its_files_define():
    """Each row of docs/ssa.md's "The paper in the code": the files its last cell names exist,
    and each `name` (or `Class.method`) there is defined in one of them."""
    table = re.search(r"^## The paper in the code\n(.*?)^## ", doc_text("docs/ssa.md"), re.S | re.M)[1]
    rows = [r.split(" | ") for r in re.findall(r"^\| (.+) \|$", table, re.M)][2:]
    assert len(rows) >= 12
    problems = []
    for row in rows:
        where = row[-1]
        files = [ROOT / f for f in re.findall(r"((?:kit|params)/[\w/-]+\.(?:py|yaml))", where)]
        assert files and all(f.exists() for f in files), where
        source = "\n".join(f.read_text() for f in files)
        for name in re.findall(r"`([\w.]+)`", where):
            if not all(re.search(rf"^\s*(?:def|class) {part}\b", source, re.M)
                       for part in name.split(".")):
                problems.append(f"{name}: not defined in {', '.join(f.name for f in files)}")
    assert not problems


# ---------------------------------------------------------------- the checker catches drift

@pytest.mark.parametrize("chunk, expected", [
    ("run_all.sh PROFILE [ARGS]  the grid of params/PROFILE.yaml (--shard i/n, --rerun ...)",
     ["`run_all.sh PROFILE ... --rerun`: --rerun is no option of run_all.sh PROFILE"]),
    ("./run_all.sh demo --per-device 2 --shard 0/2", []),
    ("./run_all.sh smoke --rerun", ["`run_all.sh smoke ... --rerun`: --rerun is no option of "
                                    "run_all.sh PROFILE"]),
    ("python -m kit.run --task RTE --rerun", []),
    ("./run_all.sh run task=RTE lrr=1e-4", ["`run_all.sh run lrr=...`: no RunConfig field 'lrr'"]),
    ("./run_all.sh slurm smoke --sbatch --mem=8G --dry-run", []),
    ("./run_all.sh slurm smoke --shard 0/2",
     ["`run_all.sh slurm ... --shard`: --shard is no option of run_all.sh slurm"]),
    ("python -m kit.predict RUN in.csv --out p.csv --text-column a",
     ["`python -m kit.predict ... --text-column`: --text-column is no option of kit.predict"]),
    ("python -m kit.nothing", ["`python -m kit.nothing`: no module kit/nothing.py"]),
    ("papermill notebooks/gamma.ipynb out.ipynb -p profile gamma -p gammas 1",
     ["`papermill ... -p gammas`: no RunConfig field or notebook parameter 'gammas'"]),
])
def test_the_checker_flags_a_command_that_does_not_exist(chunk, expected):
    assert command_problems(chunk) == expected


def test_the_checker_flags_names_files_and_links_that_do_not_exist(tmp_path):
    assert dotted_problems("`kit.cluster.signals.Forwarder`") == []
    assert dotted_problems("kit.kernels.Forwarder") == ["`kit.kernels.Forwarder`: no such "
                                                       "module or name in kit"]
    assert path_problems("tests/test_docs.py::test_no_such") == [
        "`tests/test_docs.py::test_no_such`: tests/test_docs.py has no test or class matching "
        "test_no_such"]
    assert path_problems("kit/kernels.py") == ["`kit/kernels.py`: no file kit/kernels.py"]
    assert parameter_span_problems("label_rul: code") == [
        "`label_rul: code`: 'label_rul' is no RunConfig field, profile key or key the kit writes"]
    assert yaml_problems("grid:\n  task: RTE\n  lrr: 1\nfigure: [cost]\n") == [
        "yaml: 'figure' is no profile key (description, figures, grid, notebook, paper, "
        "per_device, report, skip_missing_tasks, task_overrides)"]
    assert anchors(ROOT / "docs/kaggle.md") >= {"2-in-jupyterlab-every-fold-in-one-run-all"}
    assert slug("Encoder families: sentence representation R_CLS") == \
        "encoder-families-sentence-representation-r_cls"


# ---------------------------------------------------------------- the pages' profiles load

def page_yaml(doc: str, index: int = 0) -> str:
    return re.findall(r"^```yaml\n(.*?)^```", doc_text(doc), re.S | re.M)[index]


def test_the_profile_pages_examples_load_as_they_say(tmp_path):
    """profiles.md's example is 2 x 2 x 3 = 12 points with CoLA's override; kaggle.md's is five
    fold points reading both text columns as one value; `[sentence1, sentence2]` instead would
    be two points, one column each (the page's warning)."""
    from kit.config.profiles import load_profile
    path = tmp_path / "mine.yaml"
    path.write_text(page_yaml("docs/profiles.md"))
    points = load_profile(str(path), str(tmp_path)).points
    assert len(points) == 12
    assert {p["max_train_examples"] for p in points if p["task"] == "CoLA"} == {1500}
    kaggle = page_yaml("docs/kaggle.md")
    path.write_text(kaggle)
    points = load_profile(str(path), str(tmp_path)).points
    assert [p["fold"] for p in points] == [0, 1, 2, 3, 4]
    assert all(p["csv_text_columns"] == ["sentence1", "sentence2"] for p in points)
    path.write_text(kaggle.replace("[[sentence1, sentence2]]", "[sentence1, sentence2]"))
    columns = [p["csv_text_columns"] for p in load_profile(str(path), str(tmp_path)).points]
    assert columns == ["sentence1"] * 5 + ["sentence2"] * 5

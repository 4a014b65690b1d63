"""The layers contract (pyproject.toml, import-linter) holds for the package and breaks
on a planted upward import: a copy of the package where models/ imports engine/."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def test_layers_contract_catches_an_upward_import(tmp_path):
    shutil.copytree(
        ROOT / "lookahead_jax",
        tmp_path / "lookahead_jax",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    kept = lint(tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert re.search(r"Contracts: \d+ kept, 0 broken", kept.stdout), kept.stdout

    config = tmp_path / "lookahead_jax" / "models" / "config.py"
    config.write_text(
        config.read_text() + "\nfrom lookahead_jax.engine import generate  # planted\n"
    )
    broken = lint(tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "Parts import downward only BROKEN" in broken.stdout
    assert "lookahead_jax.models.config -> lookahead_jax.engine.generate" in broken.stdout


def test_the_step_reaches_guess_sources_only_through_the_protocol():
    """decoding/ imports no source module (the step loops over config.sources), and the
    built-in sources implement guess_source.GuessSource."""
    import ast

    import lookahead_jax as lj
    from lookahead_jax.guesses.guess_source import GuessSource

    sources = {"ngram_pool", "suffix_match", "token_recycling"}
    for path in (ROOT / "lookahead_jax" / "decoding").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module.rsplit(".", 1)[-1], *(a.name for a in node.names)}
                assert not names & sources, f"{path.name} imports a guess source: {node.module}"
    config = lj.LookaheadConfig(3, 1, 2, suffix=2, recycle=5)
    assert [s.name for s in config.sources] == ["pool", "suffix", "recycle"]
    assert all(isinstance(s, GuessSource) for s in config.sources)
    assert config.proposed_nodes == sum(s.nodes for s in config.sources) == 2 * 2 + 2 * 8 + 5


def _modules():
    return [(p, p.read_text()) for p in sorted((ROOT / "lookahead_jax").rglob("*.py"))]


def _stats_field(node) -> bool:
    """Whether `node` is `stats.FIELD` or `X.stats.FIELD` (a field of a Stats), or an
    item of one (`stats.FIELD[k]`)."""
    import ast

    if isinstance(node, ast.Subscript):
        node = node.value
    if not isinstance(node, ast.Attribute):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "stats") or (
        isinstance(owner, ast.Attribute) and owner.attr == "stats"
    )


def test_stats_are_written_in_one_place():
    """Every count of a run is made by a method of engine/stats.py's Stats, which says
    what it counts: no other module assigns a field of one, or grows one in place."""
    import ast

    writes = []
    for path, text in _modules():
        if path.name == "stats.py" and path.parent.name == "engine":
            continue
        for node in ast.walk(ast.parse(text)):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                grows = node.func.attr in ("append", "extend", "update", "setdefault", "clear")
                targets = [node.func.value] if grows else []
            writes += [f"{path.name}:{node.lineno}" for t in targets if _stats_field(t)]
    assert not writes, writes


def test_no_module_over_450_lines():
    long = {p.name: n for p, text in _modules() if (n := len(text.splitlines())) > 450}
    assert not long, long


def test_no_function_over_100_lines_but_argument_parsers():
    """A function longer than a screen and a half is split into named stages; the
    declarative argument parsers (build_parser: one add_argument per flag) are the
    exception."""
    import ast

    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1})"
        for path, text in _modules()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 100
        and node.name != "build_parser"
    ]
    assert not long, long


def test_scripts_stay_within_3000_lines():
    """scripts/ holds the README's commands and the benchmarks still in use; a one-off
    measurement is retired once its result is committed (scripts/README.md says how to
    get one back)."""
    from pathlib import Path

    root = Path(__file__).parent.parent / "scripts"
    files = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    lines = {p: len(p.read_text().splitlines()) for p in files}
    assert sum(lines.values()) <= 3000, sorted(lines.items(), key=lambda x: -x[1])[:5]


def test_scripts_import_only_what_their_siblings_define():
    """A script's `from sibling import name` (a module beside it, or in bench/, on its
    sys.path; in a function too) names a file that is there and defines `name`: three
    benchmarks once imported a retired one."""
    import ast
    import importlib.util
    from pathlib import Path

    root = Path(__file__).parent.parent / "scripts"
    broken = []
    for script in root.rglob("*.py"):
        tree = ast.parse(script.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or "." in (node.module or "."):
                continue
            found = [d / f"{node.module}.py" for d in (script.parent, root / "bench")]
            sibling = next((f for f in found if f.is_file()), None)
            if sibling is None:  # a package (one imported in a function may be optional)
                if node in tree.body and importlib.util.find_spec(node.module) is None:
                    broken.append(f"{script.name}: no {node.module}.py")
                continue
            body = ast.parse(sibling.read_text()).body
            kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            defined = {n.name for n in body if isinstance(n, kinds)}
            defined |= {
                t.id for n in body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)
            }  # fmt: skip
            broken += [f"{script.name}: {sibling.name} has no {a.name}"
                       for a in node.names if a.name not in defined]  # fmt: skip
    assert not broken, broken


def test_no_message_is_made_by_rewriting_another():
    """Errors carry their fields and each front end renders its own words (errors.py):
    the server and the command lines never build a message by str.replace on another's
    (dataclasses.replace is not a string's)."""
    import ast

    found = []
    for path, text in _modules():
        if path.parent.name not in ("server", "cli") and path.name != "errors.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if node.func.attr == "replace" and not (
                    isinstance(owner, ast.Name) and owner.id == "dataclasses"
                ):
                    found.append(f"{path.parent.name}/{path.name}:{node.lineno}")
    assert not found, found

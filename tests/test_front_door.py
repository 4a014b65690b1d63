"""The front door: `lookahead-jax COMMAND ...` (lookahead_jax/__main__.py) hands the rest of
its arguments to each command, and `python -m lookahead_jax.generate` is the command, whose
module, imported, does not hide the library function `lj.generate`."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import lookahead_jax as lj
from lookahead_jax import __main__ as front
from lookahead_jax.engine import generate as api

ROOT = Path(__file__).resolve().parents[1]
# each command: its `python -m` name's parser, and a flag only it has
COMMANDS = {
    "generate": ("lookahead_jax.cli.generate", "--prompt-file"),
    "serve": ("lookahead_jax.cli.serve", "--api-key"),
    "convert": ("lookahead_jax.cli.convert", "--src"),
    "train": ("lookahead_jax.training.__main__", "--consistency-weight"),
}


def test_help_lists_every_command(capsys):
    assert front.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lookahead-jax COMMAND")
    for name in COMMANDS:
        assert f"\n  {name} " in out, out


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_gets_the_rest_of_the_arguments(name, capsys):
    with pytest.raises(SystemExit) as e:
        front.main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    module, flag = COMMANDS[name]
    assert out.startswith(f"usage: lookahead-jax {name} ") and flag in out, out
    # the same options as under the command's `python -m` name
    parser = sys.modules[module].build_parser(f"lookahead-jax {name}")
    assert out == parser.format_help()


@pytest.mark.parametrize(
    "argv,needle",
    [([], "no command given"), (["frob"], "unknown command 'frob'"), (["--prompt"], "'--prompt'")],
)
def test_a_missing_or_unknown_command_is_one_line_exit_2(argv, needle, capsys):
    assert front.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert "give one of generate, serve, convert, train" in err


def test_bad_flags_name_the_command_as_typed(capsys):
    with pytest.raises(SystemExit) as e:
        front.main(["generate", "--bogus"])
    assert e.value.code == 2
    assert "(see lookahead-jax generate --help)" in capsys.readouterr().err


def test_the_console_script_is_installed_and_runs():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"lookahead-jax": "lookahead_jax.__main__:main"}
    script = Path(sys.executable).with_name("lookahead-jax")
    assert script.exists(), f"{script} missing: pip install -e . again"
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "generate" in r.stdout, r.stderr


def test_every_module_imports_and_lj_generate_stays_the_library_function(monkeypatch):
    """An indexer or autodoc imports every module, the command's too: lj.generate then
    still calls the library function, and says its signature. (The function and the
    module table are put back afterwards: other tests see lj.generate as imported.)"""
    import importlib
    import inspect
    import pkgutil

    monkeypatch.setattr(lj, "generate", lj.generate)
    monkeypatch.setitem(sys.modules, "lookahead_jax.generate", None)
    del sys.modules["lookahead_jax.generate"]  # (monkeypatch removes it again afterwards)

    for m in pkgutil.walk_packages(lj.__path__, "lookahead_jax."):
        if not m.name.endswith("__main__"):
            importlib.import_module(m.name)
    assert "lookahead_jax.generate" in sys.modules
    assert inspect.signature(lj.generate) == inspect.signature(api.generate)
    errors = []
    for generate in (lj.generate, api.generate):  # the module forwards what it is given
        with pytest.raises(Exception) as e:
            generate("not a model", ["a prompt"], max_new_tokens=0)
        errors.append((type(e.value), str(e.value)))
    assert errors[0] == errors[1]


ROOT_DOCS = sorted((Path(__file__).resolve().parent.parent / "docs").glob("*.md"))


@pytest.mark.parametrize("doc", ROOT_DOCS, ids=lambda p: p.name)
def test_no_code_block_in_the_docs_is_cut_by_a_fence_inside_it(doc):
    """A block of shown output that holds a ``` line (model output with code in it) ends
    there, and the rest of the page renders as code: its outer fence must be longer. The
    sign of it: a bare fence closing one block right above a bare fence opening the next."""
    lines = [line.strip() for line in doc.read_text().splitlines()]
    pairs = [i + 1 for i in range(len(lines) - 1) if lines[i] == lines[i + 1] == "```"]
    assert not pairs, f"{doc.name}: a code block cut short at line(s) {pairs}"


def readme_commands() -> list[list[str]]:
    """The README's shell lines, in order, each split as the shell would."""
    import re
    import shlex

    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [shlex.split(line, comments=True) for b in blocks for line in b.splitlines() if line]


def test_the_readmes_commands_are_on_path_where_it_uses_them_and_parse():
    """The README activates .venv before its first bare command (a new user's `python -m
    lookahead_jax...` failed with No module named 'jax' after scripts/demo.sh), the
    commands it names are installed beside this interpreter, and each command line
    parses with the command's own flags."""
    lines = readme_commands()
    activate = lines.index(["source", ".venv/bin/activate"])
    for i, argv in enumerate(lines):
        if argv[0] in ("lookahead-jax", "python"):
            assert i > activate, argv
        if argv[0] == "lookahead-jax":
            assert (Path(sys.executable).parent / "lookahead-jax").is_file()
            name, *rest = argv[1:]
            importlib.import_module(COMMANDS[name][0]).build_parser().parse_args(rest)


def test_train_help_shows_every_default():
    from lookahead_jax.training.__main__ import build_parser

    text = " ".join(build_parser().format_help().split())
    for shown in ("--block BLOCK Jacobi block size n (default: 16)", "(default: 5e-05)",
                  "(default: smollm2-135m)", "(default: OUT.work)"):  # fmt: skip
        assert shown in text, shown
    assert "default: None" not in text and "default: False" not in text

"""The README's commands are the CLI's: every ``perfscope SUBCOMMAND --option`` written in the
README (its code blocks and inline code) names a real subcommand and real options of the click
CLI (perfscope/cli/), every subcommand has a row in the Commands table, and every repository
path an example reads exists. An option the README names before the CLI has it fails here."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from perfscope.cli import cli, main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
OPTION = re.compile(r"^(--?[A-Za-z][\w-]*)")


def _code_texts(text: str) -> list[str]:
    """The README's code: each line of a fenced block, and each inline `code` span outside them."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            out.append(line.split("  #")[0])
        else:
            out += re.findall(r"`([^`]+)`", line)
    return out


def readme_commands(text: str) -> list[list[str]]:
    """Every ``perfscope SUB ...`` invocation in the README's code, as its tokens after
    ``perfscope`` (table escapes ``\\|`` undone, alternatives ``a|b`` and brackets split off)."""
    commands = []
    for code in _code_texts(text):
        for m in re.finditer(r"(?:^|[\s;&(])perfscope\s+([a-z][\w-]*)(.*?)(?=&&|;|$)", code):
            tokens = [m.group(1)]
            for raw in m.group(2).replace("\\|", "|").split():
                tokens += [t.strip("[]()") for t in raw.split("|") if t.strip("[]()")]
            commands.append(tokens)
    return commands


def _options(command: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for param in command.params:
        names |= set(param.opts) | set(param.secondary_opts)
    return names


def check_command(tokens: list[str]) -> list[str]:
    """What in one README command the CLI does not have (empty: all of it exists)."""
    sub, rest = tokens[0], tokens[1:]
    command = cli.commands.get(sub)
    if command is None:
        return [f"`perfscope {sub}`: no such subcommand (have: {', '.join(sorted(cli.commands))})"]
    problems = []
    options = _options(command)
    for token in rest:
        if token == "--":  # what follows is the profiled program's command line
            break
        m = OPTION.match(token)
        if m and m.group(1).split("=")[0] not in options:
            problems.append(f"`perfscope {sub}` has no option {m.group(1)}")
    return problems


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_the_readme_has_commands_to_check() -> None:
    subs = {c[0] for c in COMMANDS}
    assert len(COMMANDS) >= 25 and {"profile", "import", "analyze", "report"} <= subs


@pytest.mark.parametrize("tokens", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_every_readme_command_exists_in_the_cli(tokens: list[str]) -> None:
    assert check_command(tokens) == []


def test_every_subcommand_has_a_row_in_the_commands_table() -> None:
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Commands"):text.index("\n## ", text.index("## Commands") + 1)]
    rows = {m.group(1) for m in re.finditer(r"^\| `perfscope ([a-z][\w-]*)", table, re.MULTILINE)}
    assert set(cli.commands) <= rows, f"no Commands row for {sorted(set(cli.commands) - rows)}"


def test_paths_the_examples_read_exist() -> None:
    paths = {t for c in COMMANDS for t in c[1:]
             if re.match(r"^(sample_reports|tests/fixtures)/", t)}
    assert paths and all((REPO / p).exists() for p in paths), sorted(p for p in paths if not (REPO / p).exists())


def test_an_example_runs_as_written(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`perfscope analyze sample_reports/h100-qwen1.5-0.5b-kineto.perfscope --top 5`, from the
    repository root as the README says: the report's five longest kernels, in the table."""
    example = next(c for c in COMMANDS if c[0] == "analyze" and c[1:2] and c[1].startswith("sample_reports/"))
    monkeypatch.chdir(REPO)
    assert main(example) == 0
    out = capsys.readouterr().out
    assert "H100" in out


@pytest.mark.parametrize(("line", "problem"), [
    ("`perfscope no-such-command --port 1`", "`perfscope no-such-command`: no such subcommand"),
    ("`perfscope analyze PATH --no-such-option`", "`perfscope analyze` has no option --no-such-option"),
    ("| `perfscope devices [--device cpu\\|cuda] [--no-such-flag NAME]` | x |",
     "`perfscope devices` has no option --no-such-flag"),
])
def test_a_command_the_cli_lacks_fails(line: str, problem: str) -> None:
    """A README line naming a subcommand or option the CLI lacks (one another branch has not
    merged yet) is reported, in a table row as in a code block."""
    [tokens] = readme_commands(line)
    assert check_command(tokens)[0].startswith(problem)


def test_alternatives_and_the_program_after_double_dash() -> None:
    [tokens] = readme_commands("`perfscope profile --collector nsys\\|ncu [--nvml] -- python x.py --fast`")
    assert tokens == ["profile", "--collector", "nsys", "ncu", "--nvml", "--", "python", "x.py", "--fast"]
    assert check_command(tokens) == []

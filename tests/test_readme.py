"""The front door stays true: every ``saar`` command the README and the docs show exists, with
the flags they give it, and every page the README links to is there."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from extproc.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_COMMAND = re.compile(r"(?:^|[`\s(])saar ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)")
_FLAG = re.compile(r"(?<![\w-])--?[a-z][a-z-]*")


def _shown() -> set[tuple[str, ...]]:
    """(subcommand words..., flags...) of each ``saar`` command shown in code."""
    found: set[tuple[str, ...]] = set()
    for page in PAGES:
        text = page.read_text()
        code = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text)
        for block in code:
            for line in block.splitlines():
                commands = list(_COMMAND.finditer(line))
                for i, match in enumerate(commands):
                    # Its flags: every one up to the next command on the line, bracketed
                    # (``[--json]``) or after a value (``show ID --file F``) included.
                    end = commands[i + 1].start() if i + 1 < len(commands) else len(line)
                    rest = line[match.end():end]
                    found.add((*match.group(1).split(), *_FLAG.findall(rest)))
    return found


def _resolve(words: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The words that are subcommands, and the flags given."""
    parser = build_parser()
    path: list[str] = []
    for word in [w for w in words if not w.startswith("-")]:
        actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not actions or word not in actions[0].choices:  # type: ignore[attr-defined]
            break
        parser = actions[0].choices[word]  # type: ignore[attr-defined]
        path.append(word)
    return path, [w for w in words if w.startswith("-")]


SHOWN = sorted(_shown())


def test_the_pages_show_commands():
    assert len(SHOWN) >= 10


@pytest.mark.parametrize("shown", SHOWN, ids=" ".join)
def test_every_shown_command_and_flag_exists(shown, capsys):
    path, flags = _resolve(shown)
    assert path, f"saar {' '.join(shown)}: no such command"
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args([*path, "--help"])
    assert ended.value.code == 0
    usage = capsys.readouterr().out
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage), (
            f"saar {' '.join(path)} has no flag {flag}")


FOREIGN_FLAGS = {
    "envoy": {"--base-id", "--mode", "--use-dynamic-base-id"},
    "vllm": {"--block-size", "--enable-prompt-tokens-details", "--kv-events-config",
             "--lora-modules", "--served-model-name"},
    "pip": {"--force-reinstall", "--no-deps"},
    "docker": {"--build-arg"},
    "helm": {"--timeout"},
    "Dynamo's frontend": {"--router-mode", "--router-session-affinity-ttl-secs"},
    "the agent CLIs": {"--allowedTools", "--approval-mode", "--auth-type", "--continue",
                       "--dangerously-bypass-approvals-and-sandbox",
                       "--dangerously-skip-permissions", "--format", "--last", "--output-format",
                       "--skip-git-repo-check"},
    "the Semantic Router's scripts": {"--baseline-base-url",
                                      "--baseline-include-previous-response-id",
                                      "--include-previous-response-id", "--matrix"},
    "python -m extproc.dev.bench.heavy": {"--heavy-tenants", "--rounds"},
}
"""Flags the pages show for other programs (a flag in a code span with no ``saar`` command)."""


def _saar_flags(parser: argparse.ArgumentParser) -> set[str]:
    found = {f for a in parser._actions for f in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _saar_flags(sub)
    return found


def test_every_flag_shown_alone_is_a_saar_flag_or_another_programs():
    """A flag named on its own (``--listen-host`` in a list of one command's flags) is checked
    too: it is some command's, or one of the other programs' listed above."""
    known = _saar_flags(build_parser()).union(*FOREIGN_FLAGS.values())
    unknown = set()
    for page in PAGES:
        for span in re.findall(r"`([^`\n]+)`", page.read_text()):
            if not _COMMAND.search(span):
                unknown |= {(page.name, f) for f in re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", span)
                            if f not in known}
    assert sorted(unknown) == []


def test_every_linked_page_exists():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", text):
        assert (ROOT / target).exists(), target

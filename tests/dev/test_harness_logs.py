"""A stack ends with an error when a processor's log reports an asyncio error no code handled:
every end-to-end test then fails on such a bug, not only the test that looks for it."""

from __future__ import annotations

import sys

import pytest

from extproc.dev.harness import Service, check_unhandled

REPORTS = [
    ("Task exception was never retrieved", True),
    ("Exception in callback Stream.close()", True),
    ("Task was destroyed but it is pending!", True),
    ("WARNING extproc.state.layer: shared store unavailable", False),
    ("ERROR extproc.adapter.stream: ext_proc message failed", False),
]


@pytest.mark.parametrize(("line", "raises"), REPORTS)
def test_a_processors_unhandled_asyncio_error_ends_the_stack_with_an_error(
        tmp_path, line, raises):
    service = Service("processor", [sys.executable, "-m", "extproc", "serve"], tmp_path,
                      lambda _: None)
    service.log_path.write_text(f"saar: ext_proc on 127.0.0.1:1\nERROR asyncio: {line}\n")
    if raises:
        with pytest.raises(RuntimeError, match="unhandled asyncio error"):
            check_unhandled([service])
    else:
        check_unhandled([service])


def test_other_programs_logs_are_not_judged(tmp_path):
    service = Service("sim-a", [sys.executable, "-m", "extproc.dev.sim"], tmp_path,
                      lambda _: None)
    service.log_path.write_text("Task exception was never retrieved\n")
    check_unhandled([service])

"""``saar bench hangup``: the tool itself on a few hundred clients (the figure comes from a run
of 20,000), and what it is there to show: a request whose client hung up before any answer
leaves no session behind."""

from __future__ import annotations

import json

import pytest

from extproc.cli import main


@pytest.mark.e2e
def test_clients_that_hang_up_leave_no_session_behind(capsys):
    assert main(["bench", "hangup", "--clients", "200", "--warmup", "40",
                 "--concurrency", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["clients"] == 200 and len(report["rss_mib"]) == 3
    assert report["routed"] >= 100  # most reached the processor before their client left
    tables = report["tables"]
    # every session was new and its only request went unanswered, but for those whose answer
    # (a streamed one's headers) had begun when its client hung up: the processor saw those
    # headers, the client may not have (it left while Envoy passed them on)
    assert report["answers_begun"] <= 24  # of 240 requests, the warm-up's included
    assert tables["sessions"] <= report["answers_begun"]
    assert tables["owners"] == 0  # nothing was answered: nothing issued, nothing owned
    assert tables["admission_programs"] == 0

"""How writes land on a session record: the one implementation every store applies."""

from __future__ import annotations

import itertools
from dataclasses import replace

import msgpack
import orjson
import pytest

from extproc.state.records import (
    Commit,
    Finish,
    Owner,
    SessionRecord,
    Turn,
    apply,
    pack_owner,
    pack_record,
    unpack_owner,
    unpack_record,
)
from extproc.types import Phase, Usage


def turn(n: int, model: str = "m1", switched: bool = False, worker: str | None = "w1") -> Turn:
    return Turn(f"rp-{n}", "t/s", "t", model, "d", Phase.NORMAL, switched, 100 * n,
                float(n), worker)


def play(writes, record: SessionRecord | None = None) -> tuple[SessionRecord, int]:
    switches = 0
    for at, write in enumerate(writes):
        record, moved = apply(record, write, 10.0 + at)
        switches += moved
    assert record is not None
    return record, switches


TOOL_ANSWER = dict(tool_calls=True, usage=Usage(500, 20, 400))


@pytest.mark.parametrize(
    ("name", "writes", "turns", "model", "phase", "switches", "worker"),
    [
        ("commit", [Commit(turn(1))], 1, "m1", Phase.NORMAL, 0, "w1"),
        ("commit then finish", [Commit(turn(1)), Finish(turn(1), **TOOL_ANSWER)],
         1, "m1", Phase.TOOL_LOOP, 0, "w1"),
        ("finish first (the observer won the race)",
         [Finish(turn(1), **TOOL_ANSWER), Commit(turn(1))], 1, "m1", Phase.TOOL_LOOP, 0, "w1"),
        ("a commit twice lands once", [Commit(turn(1)), Commit(turn(1))],
         1, "m1", Phase.NORMAL, 0, "w1"),
        ("a switch", [Commit(turn(1)), Commit(turn(2, "m2", switched=True, worker="w9"))],
         2, "m2", Phase.NORMAL, 1, "w9"),
        ("a switch replayed after an outage counts once",
         [Commit(turn(1)), Commit(turn(2, "m2", True)), Commit(turn(2, "m2", True))],
         2, "m2", Phase.NORMAL, 1, "w1"),
        ("two replicas both switched: the second finds it done",
         [Commit(turn(1)), Commit(turn(2, "m2", True)), Commit(turn(3, "m2", True))],
         3, "m2", Phase.NORMAL, 1, "w1"),
        ("a late finish of an overtaken turn leaves the phase",
         [Commit(turn(1)), Commit(turn(2)), Finish(turn(1), **TOOL_ANSWER)],
         2, "m1", Phase.NORMAL, 0, "w1"),
        ("the served worker rebinds after an early finish",
         [Finish(turn(1, worker="picked")), Commit(turn(1, worker="served"))],
         1, "m1", Phase.NORMAL, 0, "served"),
        ("a finish never rebinds what the commit learnt",
         [Commit(turn(1, worker="served")), Finish(turn(1, worker="picked"))],
         1, "m1", Phase.NORMAL, 0, "served"),
        ("a switch without a known worker drops the old binding",
         [Commit(turn(1)), Commit(turn(2, "m2", True, worker=None))],
         2, "m2", Phase.NORMAL, 1, None),
        ("an older turn sent again after a newer one is counted, never wins",
         [Commit(turn(1)), Commit(turn(3, "m2", True, worker="w3")),
          Commit(turn(2, "m3", True, worker="w2"))],
         3, "m2", Phase.NORMAL, 1, "w3"),
    ],
)
def test_writes_on_a_record(name, writes, turns, model, phase, switches, worker):
    record, counted = play(writes)
    assert (record.turns, record.model, record.phase, counted, record.worker) == (
        turns, model, phase, switches, worker), name
    assert record.switches == switches


def test_order_of_commit_and_finish_does_not_matter():
    writes = [Commit(turn(1)), Finish(turn(1), **TOOL_ANSWER), Commit(turn(2)),
              Finish(turn(2), usage=Usage(900, 30, 800))]
    results = set()
    for order in itertools.permutations(writes[:2]):
        record, _ = play([*order, *writes[2:]])
        results.add(pack_record(record))
    assert len(results) == 1


def test_finish_keeps_the_backends_usage_and_grows_the_context():
    record, _ = play([Commit(turn(1)), Finish(turn(1), usage=Usage(5000, 70, 4096))])
    assert (record.reported_prompt_tokens, record.reported_cached_tokens) == (5000, 4096)
    assert record.context_tokens == 5070
    assert record.reported_cache_ratio == pytest.approx(4096 / 5000)


def test_apply_never_changes_the_record_it_is_given():
    record, _ = play([Commit(turn(1))])
    before = pack_record(record)
    apply(record, Commit(turn(2, "m2", True)), 99.0)
    assert pack_record(record) == before


def test_wire_forms_round_trip():
    record, _ = play([Commit(turn(1)), Commit(turn(2, "m2", True)), Finish(turn(2))])
    again = unpack_record(pack_record(record), record.version)
    assert again == record
    owner = Owner("m", "10.0.0.1:80", "t/s")
    assert unpack_owner(pack_owner(owner)) == owner
    assert unpack_owner(pack_owner(Owner("m"))) == Owner("m")
    assert Turn.from_wire(turn(3).to_wire()) == turn(3)
    with pytest.raises(ValueError):
        Turn.from_wire('["too", "short"]')


def test_a_sub_agents_record_keeps_its_parent_across_the_wire_and_its_turns():
    child = [replace(turn(n), parent="s-run") for n in (1, 2)]
    record, _ = play([Commit(child[0]), Finish(child[0]), Commit(turn(2))])
    assert record.parent == "s-run"  # set by the first turn, kept by later ones
    assert unpack_record(pack_record(record), 1).parent == "s-run"
    assert Turn.from_wire(child[1].to_wire()) == child[1]
    with pytest.raises(ValueError):
        Turn.from_wire(orjson.dumps([*orjson.loads(child[1].to_wire()), "extra"]).decode())


def test_what_a_replica_of_the_version_before_wrote_still_reads():
    """A record and a turn written without the fields this version added (a rolling
    upgrade) read with none of them: no parent, no usual model, no restart."""
    record, _ = play([Commit(turn(1)), Finish(turn(1), **TOOL_ANSWER)])
    old_record = msgpack.packb(msgpack.unpackb(pack_record(record))[:17])
    assert unpack_record(old_record, record.version) == record
    old_turn = orjson.dumps(orjson.loads(turn(3).to_wire())[:11]).decode()
    assert Turn.from_wire(old_turn) == turn(3)


def test_a_copy_has_every_field_and_shares_only_what_cannot_change():
    from dataclasses import fields

    record, _ = play([Commit(turn(1)), Commit(turn(2, "m2", True)),
                      Finish(turn(2), tool_calls=True, issued=("c1",))])
    record.version = 7
    copy = record.copy()
    assert [getattr(copy, f.name) for f in fields(copy)] == [
        getattr(record, f.name) for f in fields(record)]
    for name in ("recent", "issued", "switch_times"):
        assert isinstance(getattr(record, name), tuple), name  # shared, so immutable
    copy.turns += 1
    copy.recent += ("x",)
    assert record.turns == 2 and "x" not in record.recent


def test_the_main_loops_first_turn_starts_the_record_afresh():
    """After only light turns (no usual model), the main loop's first turn (``restart``)
    replaces them: one turn, no switch, its model and worker; the light turns' replay ids
    stay known, so one of them committed again changes nothing."""
    title = turn(1, "m1", worker="w1")
    main = replace(turn(2, "m2", worker="w2"), requested="auto", restart=True)
    record, switches = play([Commit(title), Finish(title), Commit(main), Finish(main),
                             Commit(title)])
    assert (record.turns, record.switches, switches) == (1, 0, 0)
    assert (record.model, record.worker, record.requested) == ("m2", "w2", "auto")
    assert record.recent == ("rp-1", "rp-2")
    later = play([Commit(turn(3, "m2"))], record)[0]
    assert (later.turns, later.requested) == (2, "auto")  # a light turn keeps the usual model

"""backend/store/ on real databases, each test on a SQLite file and on a real PostgreSQL server
(the `database` fixture): what is written is there after reopening the store."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from backend.cli import main
from backend.directing.protocol import CharacterSpec, SamplingInfo
from backend.schema import VERSION, take_windows
from backend.store import STOPPED_DURING_TAKE, NewerSchema, Store, StoredReference

V0_DATABASE = Path(__file__).parents[1] / "fixtures" / "store" / "retake-v0.sqlite3"
SAMPLING: SamplingInfo = {"temperature": 1.0, "top_p": 0.9, "top_k": 30, "max_new_tokens": 20, "seed": 5}


def codes(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, size=(10, frames), dtype=np.int64)  # [10, frames]


def window_count(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(take_windows)).scalar_one())


def test_takes_lines_and_codes_survive_reopening(database: Path | str) -> None:
    store = Store(database)
    session = store.create_session()
    first = store.add_take(session, "line-a", "Hello there.", None, SAMPLING)
    second = store.add_take(session, "line-b", "Who is it?", None, SAMPLING)
    retake = store.add_take(session, "line-a", "Hello there!", None, SAMPLING)
    assert first.take_id < second.take_id < retake.take_id
    assert (first.state, first.finish_reason, first.kept) == ("queued", None, False)
    store.start_take(first.take_id, 1, {**SAMPLING, "seed": 9})
    store.set_history(first.take_id, [])
    store.finish_take(first.take_id, "stop", error=None, timings={"prompt_rows": 40, "first_audio_ms": 12},
                      samples=7 * 2048, attempts=1, codes=codes(7, 0))
    store.set_kept(first.take_id, True)
    store.close()

    store = Store(database)
    assert store.has_session(session) and not store.has_session("f" * 32)
    # Line text follows the latest take; a take of a new line puts it last.
    assert store.lines(session) == [
        {"line_id": "line-a", "text": "Hello there!", "position": 0, "character_id": None},
        {"line_id": "line-b", "text": "Who is it?", "position": 1, "character_id": None},
    ]
    done = store.take(session, first.take_id)
    assert done is not None and done.usable and done.kept
    assert (done.state, done.finish_reason, done.frames, done.samples, done.attempts) == ("done", "stop", 7, 14336, 1)
    assert done.sampling["seed"] == 9 and done.timings == {"prompt_rows": 40, "first_audio_ms": 12}
    np.testing.assert_array_equal(store.take_codes(first.take_id), codes(7, 0))
    # The two takes that never finished were running when the "server" stopped.
    interrupted = [store.take(session, t.take_id) for t in (second, retake)]
    assert [(t.state, t.finish_reason, t.error) for t in interrupted if t] == [
        ("done", "error", STOPPED_DURING_TAKE)] * 2
    assert store.interrupted == 2
    assert [t.take_id for t in store.takes(session)] == [first.take_id, second.take_id, retake.take_id]
    info = store.takes(session)[0].info()
    assert info["audio_url"] == f"/sessions/{session}/takes/{first.take_id}.wav"
    store.close()


def test_calls_together_are_one_transaction(database: Path | str) -> None:
    """Store.together (a take's start: its checks' reads and its insert): one BEGIN for every
    call inside, committed at the end, all undone if the block fails."""
    store = Store(database)
    session = store.create_session()
    begins: list[object] = []
    sa.event.listen(store.engine, "begin", begins.append)
    with store.together():
        store.line_ids(session)
        assert store.count_takes(session) == 0
        with store.together():  # a block inside a block joins it
            taken = store.add_take(session, "line-a", "Hello there.", None, SAMPLING)
        assert store.count_takes(session) == 1  # its own write, before the commit
    assert len(begins) == 1
    assert store.take(session, taken.take_id) is not None  # committed
    with pytest.raises(RuntimeError, match="the request failed"):
        with store.together():
            lost = store.add_take(session, "line-b", "Never stored.", None, SAMPLING)
            raise RuntimeError("the request failed")
    assert store.take(session, lost.take_id) is None and store.line_ids(session) == ["line-a"]
    begins.clear()
    store.line_ids(session)
    store.line_ids(session)
    assert len(begins) == 2  # outside a block, each call is its own transaction
    store.close()


def test_a_running_take_keeps_the_windows_it_sent(database: Path | str) -> None:
    store = Store(database)
    session = store.create_session()
    running, finished = (store.add_take(session, "a", "Hello.", None, SAMPLING).take_id for _ in range(2))
    store.start_take(running, 1, SAMPLING)
    store.add_take_window(running, 0, codes(4, 1), 4 * 2048)  # a silent first attempt's window...
    store.start_take(running, 2, SAMPLING)  # ...is gone when the next attempt starts
    sent = codes(10, 2)
    store.add_take_window(running, 0, sent[:, :4], 4 * 2048)
    store.add_take_window(running, 1, sent[:, 4:], 6 * 2048)
    store.start_take(finished, 1, SAMPLING)
    store.add_take_window(finished, 0, codes(4, 3), 4 * 2048)
    store.finish_take(finished, "stop", error=None, timings={}, samples=5 * 2048, attempts=1, codes=codes(5, 3))
    assert window_count(store) == 2  # the running take's, not the finished one's
    store.close()  # the server dies with `running` in flight

    store = Store(database)
    take = store.take(session, running)
    assert take is not None and (take.state, take.finish_reason, take.error) == ("done", "error", STOPPED_DURING_TAKE)
    assert (take.frames, take.samples, take.attempts) == (10, 10 * 2048, 2)
    np.testing.assert_array_equal(store.take_codes(running), sent)
    np.testing.assert_array_equal(store.take_codes(finished), codes(5, 3))
    assert window_count(store) == 0
    store.close()


def test_kept_history_is_in_script_order(database: Path | str) -> None:
    store = Store(database)
    session = store.create_session()
    a1 = store.add_take(session, "a", "One.", None, SAMPLING).take_id
    b1 = store.add_take(session, "b", "Two.", None, SAMPLING).take_id
    a2 = store.add_take(session, "a", "One again.", None, SAMPLING).take_id
    c1 = store.add_take(session, "c", "Three.", None, SAMPLING).take_id
    for take_id in (b1, a2, a1, c1):
        store.set_kept(take_id, True)
    assert store.kept_history(session) == [a1, a2, b1, c1]  # line a before line b, then by take id
    # What a take of a line hears: the kept takes of the lines above it.
    assert [store.kept_history(session, line) for line in ("a", "b", "c", "new")] == [
        [], [a1, a2], [a1, a2, b1], [a1, a2, b1, c1]]
    store.set_order(session, ["c", "b", "a"])
    assert store.kept_history(session) == [c1, b1, a1, a2]
    assert store.kept_history(session, "a") == [c1, b1]
    store.set_kept(a1, False)
    assert store.kept_history(session) == [c1, b1, a2]
    store.delete_line(session, "b")  # its kept take leaves the history, and comes back with the line
    assert store.kept_history(session) == [c1, a2] and store.kept_history(session, "a") == [c1]
    store.set_line(session, "b", "Two.", after=None, place=True)
    assert store.kept_history(session) == [b1, c1, a2]


def test_keep_replaces_the_lines_kept_take_only(database: Path | str) -> None:
    store = Store(database)
    session, other = store.create_session(), store.create_session()
    a1 = store.add_take(session, "a", "One.", None, SAMPLING).take_id
    a2 = store.add_take(session, "a", "One again.", None, SAMPLING).take_id
    b1 = store.add_take(session, "b", "Two.", None, SAMPLING).take_id
    elsewhere = store.add_take(other, "a", "One.", None, SAMPLING).take_id
    assert store.keep(a1) == [] and store.keep(b1) == [] and store.keep(elsewhere) == []
    assert store.keep(a2) == [a1]  # line a's kept take changes; line b's and the other scene's stay
    assert store.kept_history(session) == [a2, b1] and store.kept_history(other) == [elsewhere]
    assert store.keep(a2) == []  # keeping it again changes nothing


def test_the_script_survives_reopening(database: Path | str) -> None:
    store = Store(database)
    session = store.create_session()
    store.set_line(session, "b", "Second.")
    store.set_line(session, "d", "")  # a line not written yet
    store.set_line(session, "a", "First.", after=None, place=True)
    store.set_line(session, "c", "Third.", after="b", place=True)
    store.set_line(session, "b", "Second, edited.")  # a text edit leaves it where it is
    taken = store.add_take(session, "e", "Fifth.", None, SAMPLING)  # a take of a new line puts it last
    store.close()

    store = Store(database)
    assert store.lines(session) == [
        {"line_id": "a", "text": "First.", "position": 0, "character_id": None},
        {"line_id": "b", "text": "Second, edited.", "position": 1, "character_id": None},
        {"line_id": "c", "text": "Third.", "position": 2, "character_id": None},
        {"line_id": "d", "text": "", "position": 3, "character_id": None},
        {"line_id": "e", "text": "Fifth.", "position": 4, "character_id": None},
    ]
    store.set_order(session, ["e", "d", "c", "b", "a"])
    store.set_line(session, "a", "First.", after="e", place=True)
    store.delete_line(session, "c")  # no takes: gone
    store.delete_line(session, "e")  # has a take: set aside with it
    store.close()

    store = Store(database)
    assert store.line_ids(session) == ["a", "d", "b"]
    assert [line["position"] for line in store.lines(session)] == [0, 1, 2]
    assert [t.line_id for t in store.takes(session)] == ["e"]  # the deleted line's take is still there
    assert store.take(session, taken.take_id) is not None
    store.add_take(session, "e", "Fifth, again.", None, SAMPLING)  # a take brings the deleted line back, last
    store.set_line(session, "c", "Third, anew.", after="a", place=True)
    assert [(line["line_id"], line["text"]) for line in store.lines(session)] == [
        ("a", "First."), ("c", "Third, anew."), ("d", ""), ("b", "Second, edited."), ("e", "Fifth, again.")]
    store.close()


def test_a_database_from_before_the_script_opens_with_its_data(tmp_path: Path) -> None:
    """tests/fixtures/store/retake-v0.sqlite3 was written by the store of commit bd3d2a2 (schema 0)."""
    path = tmp_path / "retake.sqlite3"
    shutil.copy(V0_DATABASE, path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 0
        [scene], [other] = db.execute("SELECT session_id FROM takes WHERE take_id IN (1, 5) ORDER BY take_id")
    store = Store(path)
    assert store.interrupted == 2  # l3's and the other session's take were left queued
    # The lines keep their order (first use) and text (latest take's); takes, codes, keeps and voices stay.
    assert store.lines(scene) == [
        {"line_id": "l1", "text": "The lamp is out!", "position": 0, "character_id": None},
        {"line_id": "l2", "text": "Then light it.", "position": 1, "character_id": None},
        {"line_id": "l3", "text": "Who is there?", "position": 2, "character_id": None},
    ]
    takes = store.takes(scene)
    assert [(t.take_id, t.line_id, t.kept, t.finish_reason, t.frames) for t in takes] == [
        (1, "l1", False, "stop", 7), (2, "l2", True, "stop", 5), (3, "l1", True, "stop", 9),
        (4, "l3", False, "error", 0)]
    for take in takes[:3]:
        np.testing.assert_array_equal(store.take_codes(take.take_id), codes(take.frames, take.take_id))
    assert store.kept_history(scene) == [3, 2] and store.kept_history(scene, "l2") == [3]
    voice = store.session_voice(scene)
    assert voice is not None and voice.character == CharacterSpec("Mara", "a tired keeper", None)
    [clip] = store.voice(takes[0].voice_id or 0).references
    assert clip.text == "A low hum."
    np.testing.assert_array_equal(clip.codes, codes(12, 1))
    assert store.line_ids(other) == ["x"]
    # The migrated file takes the script: a line without takes, a new order, a deletion.
    store.set_line(scene, "l0", "Before the lamp.", after=None, place=True)
    store.set_order(scene, ["l0", "l2", "l1", "l3"])
    store.delete_line(scene, "l3")
    new = store.add_take(scene, "l4", "Later.", None, SAMPLING)
    assert new.take_id == 6  # the take id sequence carries on
    store.close()

    store = Store(path)  # opening again migrates nothing
    assert store.line_ids(scene) == ["l0", "l2", "l1", "l4"]
    assert store.kept_history(scene) == [2, 3]
    store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == VERSION


def test_a_database_from_a_newer_retake_is_refused(database: Path | str, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store(database)
    with store.engine.begin() as conn:  # as a newer Retake would leave it
        if isinstance(database, Path):
            conn.exec_driver_sql(f"PRAGMA user_version={VERSION + 1}")
        else:
            conn.execute(sa.text("UPDATE retake_schema SET version = :v"), {"v": VERSION + 1})
    store.close()
    with pytest.raises(NewerSchema, match="written by a newer Retake"):
        Store(database)
    # `retake serve` says so in one line, before any engine loads.
    if isinstance(database, Path):
        where, option = database, ["--data-dir", str(database.parent)]
        advice = "--data-dir"
    else:
        where, option, advice = database, ["--database", database], "--database"
    assert main(["serve", *option]) == 2
    assert capsys.readouterr().err == (f"retake serve: {where} was written by a newer Retake (schema "
                                       f"{VERSION + 1}, this one knows {VERSION}); upgrade Retake "
                                       f"or use another {advice}\n")


def test_sessions_do_not_see_each_others_takes(database: Path | str) -> None:
    store = Store(database)
    one, two = store.create_session(), store.create_session()
    take = store.add_take(one, "a", "Mine.", None, SAMPLING)
    store.set_kept(take.take_id, True)
    assert store.take(two, take.take_id) is None
    assert store.takes(two) == [] and store.lines(two) == [] and store.kept_history(two) == []
    assert store.count_takes(one) == 1 and store.count_takes(two) == 0
    assert store.takes_by_id(two, [take.take_id]) == {}
    assert list(store.takes_by_id(one, [take.take_id])) == [take.take_id]
    assert store.kept_lines(one) == {take.take_id: "a"} and store.kept_lines(two) == {}


def test_a_history_is_read_in_one_query_each_for_its_takes_and_codes(database: Path | str) -> None:
    store = Store(database)
    session = store.create_session()
    made = [store.add_take(session, f"line-{i}", f"Line {i}.", None, SAMPLING) for i in range(5)]
    for i, take in enumerate(made[:4]):  # the last one never finishes: no codes
        store.finish_take(take.take_id, "stop", error=None, timings={}, samples=(3 + i) * 2048, attempts=1,
                          codes=codes(3 + i, i))
    ids = [take.take_id for take in reversed(made)] + [10**6]  # any order; an id of no take
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    found = store.takes_by_id(session, ids)
    read = store.takes_codes(ids)
    assert [s.split()[0] for s in statements if not s.startswith("BEGIN")] == ["SELECT", "SELECT"]
    assert sorted(found) == [take.take_id for take in made]  # the unknown id is left out
    assert [(found[t.take_id].text, found[t.take_id].state, found[t.take_id].frames) for t in made] == [
        (f"Line {i}.", "done", 3 + i) for i in range(4)] + [("Line 4.", "queued", 0)]
    assert sorted(read) == [take.take_id for take in made[:4]]
    for i, take in enumerate(made[:4]):
        np.testing.assert_array_equal(read[take.take_id], codes(3 + i, i))
        np.testing.assert_array_equal(read[take.take_id], store.take_codes(take.take_id))
    assert store.takes_by_id(session, []) == {} and store.takes_codes([]) == {}
    store.close()


def test_voices_keep_their_codes(database: Path | str) -> None:
    store = Store(database)
    session = store.create_session()
    voice = store.set_voice(session, [StoredReference("First clip.", codes(30, 1)),
                                      StoredReference("Second.", codes(12, 2))], None)
    assert voice is not None
    character = store.set_voice(session, [], CharacterSpec("Mara", "a tired keeper", None))
    assert character is not None and character.voice_id != voice.voice_id
    store.close()

    store = Store(database)
    current = store.session_voice(session)
    assert current is not None and current.info() == {
        "voice_id": character.voice_id, "references": [],
        "character": {"name": "Mara", "description": "a tired keeper", "scene": None}}
    earlier = store.voice(voice.voice_id)
    assert [r.text for r in earlier.references] == ["First clip.", "Second."]
    np.testing.assert_array_equal(earlier.references[0].codes, codes(30, 1))
    np.testing.assert_array_equal(earlier.references[1].codes, codes(12, 2))
    assert earlier.info()["references"] == [{"text": "First clip.", "frames": 30}, {"text": "Second.", "frames": 12}]
    assert store.set_voice(session, [], None) is None
    assert store.session_voice(session) is None

"""backend/store.py on real SQLite files: what is written is there after reopening the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from backend.protocol import CharacterSpec, SamplingInfo
from backend.store import STOPPED_DURING_TAKE, Store, StoredReference

SAMPLING: SamplingInfo = {"temperature": 1.0, "top_p": 0.9, "top_k": 30, "max_new_tokens": 20, "seed": 5}


def codes(frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, size=(10, frames), dtype=np.int64)  # [10, frames]


def test_takes_lines_and_codes_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "retake.sqlite3"
    store = Store(path)
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

    store = Store(path)
    assert store.has_session(session) and not store.has_session("f" * 32)
    # Line text follows the latest take; positions follow first use.
    assert store.lines(session) == [
        {"line_id": "line-a", "text": "Hello there!", "position": 0},
        {"line_id": "line-b", "text": "Who is it?", "position": 1},
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


def test_kept_history_is_in_scene_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "retake.sqlite3")
    session = store.create_session()
    a1 = store.add_take(session, "a", "One.", None, SAMPLING).take_id
    b1 = store.add_take(session, "b", "Two.", None, SAMPLING).take_id
    a2 = store.add_take(session, "a", "One again.", None, SAMPLING).take_id
    for take_id in (b1, a2, a1):
        store.set_kept(take_id, True)
    assert store.kept_history(session) == [a1, a2, b1]  # line a before line b, then by take id
    store.set_kept(a1, False)
    assert store.kept_history(session) == [a2, b1]


def test_sessions_do_not_see_each_others_takes(tmp_path: Path) -> None:
    store = Store(tmp_path / "retake.sqlite3")
    one, two = store.create_session(), store.create_session()
    take = store.add_take(one, "a", "Mine.", None, SAMPLING)
    store.set_kept(take.take_id, True)
    assert store.take(two, take.take_id) is None
    assert store.takes(two) == [] and store.lines(two) == [] and store.kept_history(two) == []
    assert store.count_takes(one) == 1 and store.count_takes(two) == 0


def test_voices_keep_their_codes(tmp_path: Path) -> None:
    path = tmp_path / "retake.sqlite3"
    store = Store(path)
    session = store.create_session()
    voice = store.set_voice(session, [StoredReference("First clip.", codes(30, 1)),
                                      StoredReference("Second.", codes(12, 2))], None)
    assert voice is not None
    character = store.set_voice(session, [], CharacterSpec("Mara", "a tired keeper", None))
    assert character is not None and character.voice_id != voice.voice_id
    store.close()

    store = Store(path)
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

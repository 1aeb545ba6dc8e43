"""The engine's pace line (pace.py): what the steps and windows since the last report were."""

from __future__ import annotations

import re

from engine.drama3.pace import Pace


def test_a_report_covers_the_steps_and_windows_since_the_last_and_resets() -> None:
    pace = Pace()
    assert pace.report() is None  # no step: nothing to say
    for ms in (5, 6, 7, 8, 40):  # five steps, one long: the one with the grouped chunks
        pace.step(ms / 1000, decoding=4, prefilled=32 if ms == 40 else 0, held=ms == 8, grouped=ms == 40)
    for ms in (3, 4, 30):
        pace.window(ms / 1000, late=ms == 30, dry=ms == 4)
    pace.drain(0.010, cpu=0.002)
    pace.drain(0.030, cpu=0.006)
    pace.cut(2)
    pace.group(prompts=8)
    pace.group(prompts=3)
    pace.carried(0.020, rows=256, warm_rows=0, prompts=2)
    pace.carried(0.030, rows=64, warm_rows=64)
    line = pace.report()
    assert line is not None
    assert re.search(r"5 steps \(p50 7\.0 ms, p95 40\.0 ms\), 4\.0 takes decoding a step, 32 prompt rows "
                     r"prefilled beside them, 1 steps held a prompt back for playback; 2 grouped prefill chunks "
                     r"of 5\.5 prompts \(steps with one p50 40\.0 ms\); 2 steps carried prompts' chunks \(p50 "
                     r"30\.0 ms; 1\.5 prompts a step; 320 rows, 64 of them warms'\); 3 windows \(2 closed early\) "
                     r"in 2 drains, closed to audio p50 4\.0 ms, p95 30\.0 ms, 1 made late by the vocoder, 1 "
                     r"closed after their client ran dry; vocoder busy \d+% \(drain p50 "
                     r"30\.0 ms, p95 30\.0 ms; its thread on a CPU 20% of them\)", line), line
    assert "codec calls" not in line  # none timed (a CPU's vocoder has no events)
    assert pace.report() is None  # reset: the next line covers only what follows
    pace.step(0.010, decoding=1, prefilled=0, held=False)
    line = pace.report()
    assert line is not None and "1 steps (p50 10.0 ms" in line and "windows" not in line and "grouped" not in line
    assert "carried" not in line


def test_a_report_says_what_the_vocoders_calls_took_on_the_gpu() -> None:
    pace = Pace()
    pace.step(0.015, decoding=30, prefilled=0, held=False)
    pace.window(0.020)
    pace.drain(0.020, cpu=0.015)
    for ms in (2.2, 9.5, 4.0, 3.1):
        pace.call(ms)
    line = pace.report()
    assert line is not None
    assert re.search(r"its thread on a CPU 75% of them\); 4 codec calls on the GPU p50 4\.0 ms, p95 9\.5 ms$",
                     line), line
    pace.step(0.015, decoding=1, prefilled=0, held=False)
    pace.drain(0.010)
    line = pace.report()
    assert line is not None and "codec calls" not in line  # reset


def test_a_report_says_what_the_engine_loops_turns_took_and_how_much_of_them_it_ran() -> None:
    pace = Pace()
    pace.step(0.015, decoding=30, prefilled=0, held=False)
    for turn_ms, step_ms, handed_ms in ((28, 15, 9), (30, 16, 10), (26, 14, 8)):
        pace.turn(turn_ms / 1000, cpu=turn_ms / 2000, step=step_ms / 1000, handed=handed_ms / 1000)
    line = pace.report()
    assert line is not None
    assert re.search(r"; 3 turns of the engine loop \(p50 28\.0 ms, p95 30\.0 ms; engine step p50 15\.0 ms, "
                     r"events handed p50 9\.0 ms\), its thread on a CPU 50% of them$", line), line
    pace.step(0.015, decoding=1, prefilled=0, held=False)
    line = pace.report()
    assert line is not None and "turns" not in line  # reset with the rest (a bench's engine has no loop)

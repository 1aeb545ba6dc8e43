"""`retake bench retake` on the tiny demo (CPU): each mode restores the rows it claims to, the
line written into the script is warmed whole, and the JSON holds the ratios and memory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.bench import retake


def test_each_mode_restores_what_it_names(tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    retake.add_arguments(parser)
    out = tmp_path / "retake.json"
    args = parser.parse_args(["--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--history-rows", "0", "300",
                              "--turn-frames", "60", "--repeats", "1", "--frames", "3", "--json", str(out)])
    assert retake.run(args) == 0
    assert "ratio: first audio of a retake with 300 rows of history / with 0, cache on" in capsys.readouterr().out
    report = json.loads(out.read_text())
    for size in (0, 300):
        rows = {row["take"] + "/" + row["cache"]: row for row in report["rows"] if row["history_rows"] == size}
        assert rows["retake/off"]["cached_rows"] == 0 == rows["first (cold)/on"]["cached_rows"]
        assert rows["retake/on"]["cached_rows"] == rows["retake/on"]["prompt_rows"]
        # the history restored, the line prefilled; the line written: nothing prefilled
        warmed, written = rows["next line, warmed/on"], rows["next line, written/on"]
        assert 0 < warmed["cached_rows"] < warmed["prompt_rows"]
        assert written["cached_rows"] == written["prompt_rows"] > warmed["cached_rows"]
        assert rows["next line/on"]["cached_rows"] < rows["next line/on"]["prompt_rows"]
    assert set(report["ratios"]) == {"on", "off"} and report["memory"]["row_bytes"] > 0

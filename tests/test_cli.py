"""The `retake` command line: a path that cannot be used is one line and exit 2, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_an_unusable_path_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = subprocess.run([sys.executable, "-m", "backend.cli", "make-checkpoint", "tiny", str(blocker / "ckpt")],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("retake make-checkpoint: cannot use ")
    assert "Traceback" not in run.stderr


def test_serve_refuses_an_unusable_data_dir_before_loading(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = subprocess.run([sys.executable, "-m", "backend.cli", "serve", "--data-dir", str(blocker / "data"),
                          "--port", "8999"], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent.parent)
    assert run.returncode == 2
    expected = f"retake serve: --data-dir {blocker / 'data'} cannot be used: Not a directory"
    assert run.stderr.strip().splitlines() == [expected]


def test_version() -> None:
    run = subprocess.run([sys.executable, "-m", "backend.cli", "--version"], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0 and run.stdout.strip().startswith("retake 0.")

"""The store's disk misbehaving under a live server: frozen (fsfreeze), the event loop must not wait
for it, so other sessions are answered; full (a small tmpfs), a take that cannot be stored ends
as an error that says so, and the server carries on. These need root (mount, fsfreeze) and are
skipped without it."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import LiveServer, run

from backend.directing.jobs import SilenceGuard
from backend.tools.client import Director

QUIET = {"silence": SilenceGuard(retries=0)}


def sh(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def mounted(target: Path, *command: str) -> Iterator[Path]:
    target.mkdir(parents=True, exist_ok=True)
    try:
        sh(*command, str(target))
    except (subprocess.CalledProcessError, FileNotFoundError, PermissionError) as error:
        pytest.skip(f"cannot mount a test filesystem here ({error}); needs root")
    try:
        yield target
    finally:
        subprocess.run(["fsfreeze", "-u", str(target)], capture_output=True, timeout=60)
        subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=60)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted(tmp_path / "small", "mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs") as disk:
        yield disk


@pytest.fixture
def freezable_disk(tmp_path: Path) -> Iterator[Path]:
    """ext4 in a file, loop-mounted (tmpfs cannot be frozen)."""
    if shutil.which("fsfreeze") is None or shutil.which("mkfs.ext4") is None:
        pytest.skip("fsfreeze and mkfs.ext4 are needed")
    image = tmp_path / "disk.img"
    with image.open("wb") as f:
        f.truncate(32 * 2**20)
    sh("mkfs.ext4", "-q", str(image))
    with mounted(tmp_path / "frozen", "mount", "-o", "loop", str(image)) as disk:
        yield disk


def fill(disk: Path, leave: int) -> Path:
    """A file taking all of the disk's free space but `leave` bytes."""
    stats = os.statvfs(disk)
    filler = disk / f"filler-{uuid.uuid4().hex}"
    with filler.open("wb") as f:
        f.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave))
    return filler


def test_a_frozen_disk_does_not_stop_other_sessions(make_server: Any, freezable_disk: Path) -> None:
    server: LiveServer = make_server(data_dir=freezable_disk, **QUIET)

    async def main() -> None:
        writer = await Director.connect(server.ws)
        await writer.open()
        other = await Director.connect(server.ws)
        await other.open()
        other.patience_s = 30
        sh("fsfreeze", "-f", str(freezable_disk))
        try:
            await writer.send({"type": "line.set", "line_id": "a", "text": "Waits for the disk.", "ref": "w"})
            pong = await other.request({"type": "ping", "t": 3}, "pong")  # the event loop is not waiting
            assert pong["t"] == 3
            writer.patience_s = 1
            with pytest.raises(TimeoutError):
                await writer.expect("script")  # its write is still waiting for the disk
        finally:
            sh("fsfreeze", "-u", str(freezable_disk))
        writer.patience_s = 60
        script = await writer.expect("script")
        assert script["ref"] == "w" and script["lines"][0]["text"] == "Waits for the disk."
        await writer.close()
        await other.close()

    run(main())


def test_a_full_disk_ends_the_take_as_an_error_and_the_server_carries_on(make_server: Any,
                                                                        small_disk: Path) -> None:
    server: LiveServer = make_server(data_dir=small_disk, **QUIET)
    database = small_disk / "retake.sqlite3"

    async def main() -> None:
        director = await Director.connect(server.ws)
        await director.open()
        other = await Director.connect(server.ws)
        await other.open()
        # Room for the take's first writes, not for all of them: the WAL starts empty and must grow.
        with contextlib.closing(sqlite3.connect(database)) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        filler = fill(small_disk, leave=48 * 1024)
        take = await director.start("a", "A long speech that goes on and on.",
                                    sampling={"max_new_tokens": 1200, "seed": 7})
        print("BRANCH", take.take_id)
        if take.take_id:  # (stored before the disk ran out: the usual case)
            done = (await director.finish(take)).done
            assert done["finish_reason"] == "error" and "disk is full" in str(done["error"]), done
        else:
            error = take.messages[0]
            assert "disk is full" in str(error["message"]), error
        # Other sessions are answered, and told plainly why what they ask cannot be stored.
        pong = await other.request({"type": "ping", "t": 1}, "pong")
        assert pong["t"] == 1
        error = await other.request({"type": "line.set", "line_id": "b", "text": "No room.", "ref": "b"}, "error")
        assert error["code"] == "internal" and "disk is full" in str(error["message"]) and error["ref"] == "b"
        # Room again: everything works.
        filler.unlink()
        again = await director.take("a", "Short now.", sampling={"max_new_tokens": 8, "seed": 7})
        assert again.done["finish_reason"] in ("stop", "length")
        await director.close()
        await other.close()

    run(main())

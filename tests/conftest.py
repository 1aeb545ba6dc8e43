"""Shared fixtures: the tiny Drama 3 and PersonaPlex checkpoints, written once per test session,
and a real PostgreSQL server (backend/tools/postgres.py) for the store's tests."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.tools.postgres import MISSING, LocalPostgres, binaries

DATABASES = itertools.count()  # names of the tests' PostgreSQL databases


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With RETAKE_REPORT_NOW set (scripts/gpu does): each failure's traceback as it happens.
    Why: a device-side assert aborts the process before pytest's summary, and the stop-41 GPU
    run lost every failure's reason that way."""
    if report.failed and os.environ.get("RETAKE_REPORT_NOW"):
        sys.stdout.write(f"\n----- {report.nodeid} failed ({report.when}) -----\n{report.longreprtext}\n")
        sys.stdout.flush()


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Every model in the tests is tiny: thousands of small ops that one thread runs as fast
    as two alone, and far faster on a shared CPU (two threads stall on each other's slices)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Drama 3 checkpoint in the released layout (seed 0)."""
    from engine.drama3.tiny import write_tiny_checkpoint

    path = tmp_path_factory.mktemp("drama3-tiny")
    write_tiny_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint: Path):
    """(Drama3Model, Drama3Config, Tokenizer) of the tiny checkpoint, float32 on CPU.

    Shared by the session: a test that runs it calls `model.setup_caches(...)` first."""
    import torch

    from engine.drama3.checkpoint import load_model

    return load_model(tiny_checkpoint, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def personaplex_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PersonaPlex checkpoint in the released layout (seed 0)."""
    from engine.personaplex.tiny import write_tiny_checkpoint

    path = tmp_path_factory.mktemp("personaplex-tiny")
    write_tiny_checkpoint(path, seed=0)
    return path


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """One throwaway PostgreSQL server for the test session (skipped, saying why, without the binaries).
    Its folder is under /tmp itself: the `postgres` user cannot enter pytest's root-only folders."""
    if binaries() is None:
        pytest.skip(f"{MISSING}; scripts/test installs it when run as root")
    folder = Path(tempfile.mkdtemp(prefix="retake-postgres-"))
    server = LocalPostgres(folder, durable=False)
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """An empty store database: a SQLite file, or a new database on the PostgreSQL server (its URL)."""
    if request.param == "sqlite":
        return tmp_path / "retake.sqlite3"
    server: LocalPostgres = request.getfixturevalue("postgres")
    return server.create_database(f"test_{next(DATABASES)}")

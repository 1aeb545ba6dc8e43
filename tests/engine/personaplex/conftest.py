"""Fixtures for the PersonaPlex tests: the tiny checkpoint, written once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The tiny model is thousands of small ops: one thread is ~20x faster than two on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def personaplex_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PersonaPlex checkpoint in the released layout (seed 0)."""
    from engine.personaplex.tiny import write_tiny_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("personaplex-tiny")
    write_tiny_checkpoint(path, seed=0)
    torch.set_num_threads(threads)
    return path

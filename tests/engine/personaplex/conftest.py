"""Fixtures for the PersonaPlex tests: the tiny checkpoint, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def personaplex_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PersonaPlex checkpoint in the released layout (seed 0)."""
    from engine.personaplex.tiny import write_tiny_checkpoint

    path = tmp_path_factory.mktemp("personaplex-tiny")
    write_tiny_checkpoint(path, seed=0)
    return path

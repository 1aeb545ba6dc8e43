"""scripts/gpu_run.py: each stage's time limit within a call's budget."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from gpu_run import LIMITS_S, stage_limits


def test_the_last_stage_run_gets_the_budget_unless_its_limit_is_asked() -> None:
    alone = stage_limits(["env", "pytest"], dict(LIMITS_S), {}, 290.0)
    assert alone["pytest"] == 290.0 and alone["env"] == LIMITS_S["env"]
    # Stages before the last keep their share; the last gets the rest of the budget.
    several = stage_limits(["env", "pytest", "serve"], dict(LIMITS_S), {}, 555.0)
    assert several["pytest"] == LIMITS_S["pytest"] and several["serve"] == 555.0
    # An asked limit stands, even below the share.
    asked = stage_limits(["env", "converse"], {**LIMITS_S, "converse": 40.0}, {"converse": 40.0}, 330.0)
    assert asked["converse"] == 40.0

"""The end-to-end fixtures: Debian's Chromium and a fresh build of the pages (pages.py has the rest)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pages import ROOT

CHROMIUM = Path("/usr/bin/chromium")


def _pages_are_stale() -> bool:
    built = [ROOT / "frontend" / "dist" / name for name in ("index.html", "converse.html")]
    if not all(path.is_file() for path in built):
        return True
    sources = [*(ROOT / "frontend").glob("*.html"), ROOT / "frontend" / "vite.config.ts",
               *(ROOT / "frontend" / "src").rglob("*")]
    return max(p.stat().st_mtime for p in sources if p.is_file()) > min(p.stat().st_mtime for p in built)


@pytest.fixture(scope="session")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium and scripts/test could not install it "
                    "(it needs root and apt); install it with: apt-get install chromium")
    return CHROMIUM


@pytest.fixture(scope="session")
def pages_built() -> None:
    if shutil.which("node") is None or not (ROOT / "node_modules" / "playwright-core").is_dir():
        pytest.fail("the e2e test needs Node 20 and the front-end packages: run scripts/setup")
    if _pages_are_stale():
        subprocess.run(["npm", "run", "--silent", "build"], cwd=ROOT, check=True, timeout=300)

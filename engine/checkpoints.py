"""Where a checkpoint comes from: a directory, the Hugging Face cache (or Hub), or a demo written once.

    path = resolve_checkpoint("fishaudio/drama-3", HUB_PATTERNS)   # or a directory
    path = demo_checkpoint("drama3-tiny", write_tiny_checkpoint)    # the random-weight demo
    demo_weights(path)                                              # its config.json says so

Design choices:
- One resolution for both engines. A directory is used as it is (it must hold
  config.json); "owner/name" or "owner/name@revision" is a Hugging Face repo id, looked
  up in the local cache first (local_files_only) and downloaded only when the cache lacks
  it and HF_HUB_OFFLINE is not set. Offline and absent is a clear error, not a hang.
  Each engine names the files it needs (`patterns`), so a download fetches only those.
- Demo checkpoints (random weights) live in $XDG_CACHE_HOME/retake/<name>, written on
  first use. `write_once` makes a directory atomically: written into a staging directory
  beside it, then renamed, so a reader sees all of it or none and racing writers are
  harmless (the loser's copy is removed). Voice archives are extracted the same way.
- A random-weight checkpoint says so in its config.json (`"demo_weights": true`, written
  by both tiny writers): `demo_weights` reads that flag, the one rule for both engines,
  so the UI and logs can say its audio is noise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import CheckpointError

CONFIG_FILE = "config.json"
REPO_ID = re.compile(r"[\w.-]+/[\w.-]+(@[\w./-]+)?")
DEMO_FLAG = "demo_weights"


def cache_dir() -> Path:
    """Retake's cache: $XDG_CACHE_HOME/retake (default ~/.cache/retake)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "retake"


def resolve_checkpoint(source: Path | str, patterns: Sequence[str]) -> Path:
    """A checkpoint directory from a path or a Hugging Face repo id ("owner/name[@revision]");
    `patterns` are the files to fetch if the repo must be downloaded."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / CONFIG_FILE).is_file():
            raise CheckpointError(f"{path} has no {CONFIG_FILE}; is it a checkpoint directory?")
        return path
    text = str(source)
    if path.exists() or text.startswith((".", "~", "/")) or not REPO_ID.fullmatch(text):
        raise CheckpointError(f"{text} is neither a checkpoint directory nor a Hugging Face repo id (owner/name)")
    return hub_snapshot(text, patterns)


def hub_snapshot(repo: str, patterns: Sequence[str]) -> Path:
    """The repo's snapshot from the Hugging Face cache, downloading it only if that is allowed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id, _, revision = repo.partition("@")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=list(patterns),
                                      local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise CheckpointError(f"{repo} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
                              f"download it first (huggingface-cli download {repo_id}) or pass a directory")
    print(f"[retake] {repo} is not in the Hugging Face cache; downloading", file=sys.stderr, flush=True)
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=list(patterns)))
    except Exception as error:
        raise CheckpointError(f"could not download {repo} from the Hugging Face Hub ({type(error).__name__}: "
                              f"{error}); download it first or pass a directory") from error


def write_once(path: Path, write: Callable[[Path], object]) -> Path:
    """Directory `path`, made by `write(staging directory)` then one rename unless it exists."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        write(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        staging.rename(path)  # atomic: readers see the whole directory or none
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not path.exists():  # another writer winning the race is no failure
            raise
    return path


def demo_checkpoint(name: str, write: Callable[[Path], object]) -> Path:
    """The demo checkpoint `name` in Retake's cache, written by `write(directory)` on first use."""
    path = cache_dir() / name
    if (path / CONFIG_FILE).is_file():
        return path
    if path.exists():
        raise CheckpointError(f"{path} exists but holds no checkpoint; remove it to have the demo rewritten")
    print(f"[retake] writing the tiny demo checkpoint to {path} (random weights: its audio is noise)",
          file=sys.stderr, flush=True)
    return write_once(path, write)


def demo_weights(path: Path) -> bool:
    """Whether the checkpoint's config.json flags random weights (`"demo_weights": true`)."""
    try:
        raw = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get(DEMO_FLAG) is True

"""Where a bench's GPU memory went: allocated and peak GiB at each phase, and with a file the
largest live allocations by the line of our code that made them.

    trace = MemoryTrace(device, path)      # path None: the phases' figures only
    ...build the engine...; trace.mark("engine")
    ...open a conversation...; trace.mark("open")
    trace.phases                           # {"engine": {"allocated_gib": .., "peak_gib": ..}, ...}

Why: `bench personaplex` at the released size peaked at 75.35 GiB with one conversation on
stop 41 and 42's H100s (16.9 GiB on stop 35's H200: ~15.6 GiB of weights and 0.77 GiB a
conversation), a state nowhere in the arithmetic of `engine.memory()`. The trace named the
lines (the prompt attention's dequantised rings, 680 blocks each), which were what autograd
saves: the prompt reader's captured chunks ran with gradients on (prompt_reader.py).

Design choices:
- PyTorch's allocator history (`torch.cuda.memory._record_memory_history`, Python stacks)
  is the one record of which code holds a block; it is private API, so a trace that cannot
  start says so in its file and the phases' figures still come.
- Blocks are grouped by the innermost frame inside this repository (engine/, backend/):
  the line that asked, not torch's internals; and by the pool they are in (a CUDA graph's
  private pool keeps what its capture allocated: stop 42's trace did not yet say which).
- CUDA only; elsewhere every call is a no-op.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

GIB = 2**30
TOP = 12  # allocation sites written per phase
OURS = ("/engine/", "/backend/")


class MemoryTrace:
    def __init__(self, device: torch.device, path: Path | None) -> None:
        self.cuda, self.path = device.type == "cuda", path
        self.phases: dict[str, dict[str, float]] = {}
        self.recording = False
        if self.cuda and path is not None:
            try:
                torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
                self.recording = True
            except (AttributeError, RuntimeError, TypeError) as error:
                with path.open("a") as file:
                    file.write(f"allocator history unavailable: {error}\n")

    def mark(self, phase: str) -> None:
        """The phase's allocated and peak GiB; with a file, its largest live allocation sites."""
        if not self.cuda:
            return
        self.phases[phase] = {"allocated_gib": round(torch.cuda.memory_allocated() / GIB, 2),
                              "peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 2)}
        if self.path is None:
            return
        lines = [f"== {phase}: allocated {self.phases[phase]['allocated_gib']} GiB, "
                 f"peak {self.phases[phase]['peak_gib']} GiB"]
        if self.recording:
            sites = live_sites(torch.cuda.memory._snapshot())
            lines += [f"  {size / GIB:8.3f} GiB in {count:5d} blocks  {site}" for site, (size, count) in sites[:TOP]]
        with self.path.open("a") as file:
            file.write("\n".join(lines) + "\n")

    def close(self) -> None:
        if self.recording:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False


def live_sites(snapshot: dict[str, Any]) -> list[tuple[str, tuple[int, int]]]:
    """(site, (bytes, blocks)) of the snapshot's live blocks, most bytes first; a site is the
    innermost frame of our code that allocated the block ("?" where none was recorded)."""
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for segment in snapshot.get("segments", []):
        # a CUDA graph's private pool has an id other than (0, 0): whether a graph holds the block
        pool = segment.get("segment_pool_id")
        where = f" [graph pool {tuple(pool)}]" if pool is not None and tuple(pool) != (0, 0) else ""
        for block in segment.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            frames = block.get("frames") or []
            ours = [f for f in frames if any(part in str(f.get("filename", "")) for part in OURS)]
            frame = ours[0] if ours else None
            site = (f"{Path(frame['filename']).name}:{frame['line']} {frame.get('name', '')}" if frame else "?") + where
            sites[site][0] += int(block.get("size", 0))
            sites[site][1] += 1
    return sorted(((site, (size, count)) for site, (size, count) in sites.items()), key=lambda s: -s[1][0])

"""Prometheus text exposition for `/metrics`, written by hand (no client library).

Counters and histograms are plain dicts and lists updated on the event loop thread only, so
they need no locks. Gauges (queue depth, open sessions) are read when scraped.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "deadline", "cancelled", "error")


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.count += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            out.append(f'{self.name}_bucket{{le="{bound:g}"}} {cumulative}')
        out += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.total:g}",
                f"{self.name}_count {self.count}"]
        return out


class Metrics:
    def __init__(self, queue_depth: Callable[[], int], sessions: Callable[[], int]) -> None:
        self.queue_depth = queue_depth
        self.sessions = sessions
        self.conversations: Callable[[], int] = lambda: 0  # live conversations (`retake serve --converse`)
        # their system prompts by how they started: read (a chunk a tick) or copied (read before)
        self.system_prompts: Callable[[], dict[str, int]] = dict
        self.draining: Callable[[], bool] = lambda: False  # SIGTERM came: no new takes (backend/draining.py)
        # The engine's prefix cache counters (engine/drama3/prefix.py), None when it is off.
        self.prefix_cache: Callable[[], dict[str, int] | None] = lambda: None
        self.warms: Callable[[], dict[str, int]] = dict  # prefix warms ended, by finish reason (directing/loop.py)
        self.takes: dict[str, int] = dict.fromkeys(FINISH_REASONS, 0)
        self.retries = 0
        self.exports = {"kept": 0, "vocoded": 0}  # take exports served from kept audio, or vocoded on the engine
        self.first_audio = Histogram(
            "retake_first_audio_seconds", "Time from take.start to the first audio window on the engine.",
            (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0))
        self.decode_fps = Histogram(
            "retake_decode_frames_per_second", "Decode speed of finished takes, in frames per second.",
            (5, 10, 21.5, 30, 50, 75, 100, 150, 200, 300, 500, 1000))

    def take_done(self, finish_reason: str, timings: dict[str, float | int | None]) -> None:
        self.takes[finish_reason] = self.takes.get(finish_reason, 0) + 1
        first_audio, queue = timings.get("first_audio_ms"), timings.get("queue_ms") or 0
        if first_audio is not None:
            self.first_audio.observe((first_audio + queue) / 1000)
        fps = timings.get("decode_frames_per_s")
        if fps:
            self.decode_fps.observe(float(fps))

    def render(self) -> str:
        lines = ["# HELP retake_takes_total Finished takes by finish reason.", "# TYPE retake_takes_total counter"]
        lines += [f'retake_takes_total{{finish_reason="{reason}"}} {count}' for reason, count in self.takes.items()]
        lines += ["# HELP retake_take_retries_total Take attempts stopped by the silence guard.",
                  "# TYPE retake_take_retries_total counter", f"retake_take_retries_total {self.retries}",
                  "# HELP retake_queue_depth Engine jobs waiting to run.", "# TYPE retake_queue_depth gauge",
                  f"retake_queue_depth {self.queue_depth()}",
                  "# HELP retake_sessions Open directing sockets.", "# TYPE retake_sessions gauge",
                  f"retake_sessions {self.sessions()}",
                  "# HELP retake_conversations Live conversations on /converse.", "# TYPE retake_conversations gauge",
                  f"retake_conversations {self.conversations()}",
                  "# HELP retake_conversation_prompts_total Conversations started, by how their system prompt was "
                  "(read: a chunk a tick; copied: the same persona and voice read before).",
                  "# TYPE retake_conversation_prompts_total counter",
                  *(f'retake_conversation_prompts_total{{how="{how}"}} {count}'
                    for how, count in sorted(self.system_prompts().items())),
                  "# HELP retake_draining 1 while the replica drains (SIGTERM): no new takes, sockets move away.",
                  "# TYPE retake_draining gauge", f"retake_draining {int(self.draining())}",
                  "# HELP retake_take_exports_total Take exports (alone or in a scene's export), by where the audio "
                  "came from (kept when the take ended, or vocoded again on the engine).",
                  "# TYPE retake_take_exports_total counter"]
        lines += [f'retake_take_exports_total{{audio="{source}"}} {count}' for source, count in self.exports.items()]
        lines += self.first_audio.lines() + self.decode_fps.lines()
        stats = self.prefix_cache()
        lines += prefix_cache_lines(stats)
        if stats is not None:
            lines += ["# HELP retake_prefix_warms_total Prompts prefilled into the prefix cache ahead of a take (the "
                      "next line after a keep), by how they ended (cached: the cache held it already).",
                      "# TYPE retake_prefix_warms_total counter"]
            lines += [f'retake_prefix_warms_total{{finish_reason="{reason}"}} {count}'
                      for reason, count in sorted(self.warms().items())]
        return "\n".join(lines) + "\n"


def prefix_cache_lines(stats: dict[str, int] | None) -> list[str]:
    """The prefix cache's counters and gauges; none when it is off."""
    if stats is None:
        return []
    return ["# HELP retake_prefix_cache_lookups_total Prompts looked up in the prefix cache, by result "
            "(hit: the whole prompt restored; partial: a prefix; miss: prefilled from row 0).",
            "# TYPE retake_prefix_cache_lookups_total counter",
            f'retake_prefix_cache_lookups_total{{result="hit"}} {stats["hits"]}',
            f'retake_prefix_cache_lookups_total{{result="partial"}} {stats["partial_hits"]}',
            f'retake_prefix_cache_lookups_total{{result="miss"}} {stats["misses"]}',
            "# HELP retake_prefix_cache_rows_total Prompt rows restored from snapshots (saved) and prefilled.",
            "# TYPE retake_prefix_cache_rows_total counter",
            f'retake_prefix_cache_rows_total{{kind="saved"}} {stats["rows_saved"]}',
            f'retake_prefix_cache_rows_total{{kind="prefilled"}} {stats["rows_prefilled"]}',
            "# HELP retake_prefix_cache_rows_in_place_total Of the rows restored, those the take's slot held "
            "already from its last prompt (not copied).",
            "# TYPE retake_prefix_cache_rows_in_place_total counter",
            f'retake_prefix_cache_rows_in_place_total {stats["rows_in_place"]}',
            "# HELP retake_prefix_cache_bytes Bytes the prefix cache's snapshots hold, by memory.",
            "# TYPE retake_prefix_cache_bytes gauge",
            f'retake_prefix_cache_bytes{{memory="device"}} {stats["device_bytes"]}',
            f'retake_prefix_cache_bytes{{memory="host"}} {stats["host_bytes"]}',
            "# HELP retake_prefix_cache_snapshots Snapshots held.", "# TYPE retake_prefix_cache_snapshots gauge",
            f"retake_prefix_cache_snapshots {stats['snapshots']}",
            "# HELP retake_prefix_cache_evictions_total Snapshots (or their states) dropped or moved to the host "
            "for memory.", "# TYPE retake_prefix_cache_evictions_total counter",
            f'retake_prefix_cache_evictions_total{{kind="dropped"}} {stats["evictions"]}',
            f'retake_prefix_cache_evictions_total{{kind="spilled"}} {stats["spills"]}']

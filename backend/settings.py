"""Server settings: what `retake serve` options set, in one frozen dataclass.

The protocol limits (`Limits`) are part of it; the engine's own limits (prompt rows, new
tokens, reference seconds) replace the defaults once the engine is loaded, so the limits a
client sees in `session.ready` are the ones that apply.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from backend.directing.jobs import SilenceGuard
from backend.directing.protocol import Limits

FRONTEND_DIST = Path(__file__).resolve().parents[1] / "frontend" / "dist"


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str | None = None  # a PostgreSQL database (postgresql://...); None: SQLite under data_dir
    checkpoint: Path | str | None = None  # a directory or a Hub repo id; None: the tiny demo checkpoint
    random_weights: str | None = None  # a preset ("full", "tiny") with random weights made on the device instead
    device: str = "auto"
    first_window_frames: int | None = None
    kernels: tuple[str, ...] | None = None  # the decode step's Triton kernels on CUDA; None: the engine's
    prefill_group: int | None = None  # prompts per prefill chunk (engine/drama3/prefill_groups.py); None: the engine's
    mixed_step: bool | None = None  # decode steps carry a prompt's chunk (engine/drama3/mixed.py); None: the engine's
    mixed_group: bool = False  # ...several prompts' chunks a step, where prefill groups are on (--mixed-step groups)
    early_windows: bool = False  # windows close early where a client runs short (engine/drama3/take.py)
    vocoder_order: str = "deadline"  # which queued windows vocode first (engine/drama3/vocoder.py)
    warms_yield: bool = False  # warms wait while the vocoder has a window due (engine/drama3/slots.py)
    keep_warms: bool = True  # a warm's snapshot is evicted last until its take (engine/drama3/prefix.py)
    compile_prefill: bool = False  # prefill chunks through compiled layers on CUDA (engine/drama3/fast.py)
    vocoder_compile: bool = True  # the window graphs through Inductor on CUDA (engine/drama3/codec_graphs.py)
    slots: int | None = None  # takes decoding together; None: the engine's default for the device
    threads: int | None = None  # CPU threads for torch; None: the engine's default (half the cores)
    prefix_cache_gib: float | None = None  # prefix snapshots (engine/drama3/prefix.py); None: the engine's default
    prefix_cache_host_gib: float = 0.0  # host memory for snapshots evicted from the GPU
    host: str = "127.0.0.1"  # the address given to --host (a name there is one the server answers to)
    allow_hosts: tuple[str, ...] = ()  # more names the server answers to (backend/admission.py)
    allow_origins: tuple[str, ...] = ()  # besides the server's own origins; "*" allows any
    token: str | None = None
    limits: Limits = field(default_factory=Limits)
    silence: SilenceGuard = field(default_factory=SilenceGuard)
    send_queue_frames: int = 256  # audio frames waiting for a slow client before its take is stopped
    send_timeout_s: float = 20.0  # a socket whose client reads nothing for this long is dropped
    open_timeout_s: float = 30.0  # a socket must open its session (conversation) within this
    keepalive_s: float = 20.0  # a protocol ping this often; unanswered for as long again, the socket is dropped
    static_dir: Path = FRONTEND_DIST
    conversation: Path | str | None = None  # a PersonaPlex checkpoint for /converse; "demo": the tiny one; None: off
    conversation_slots: int = 2  # conversations at once
    conversation_random: str | None = None  # PersonaPlex with random weights of this size ("released", "tiny")
    conversation_compiled: bool | None = None  # PersonaPlex's compiled tick paths (None: on a GPU)

    @property
    def database(self) -> Path | str:
        """What backend/store/ opens: the database URL, or the SQLite file under data_dir."""
        return self.database_url or self.data_dir / "retake.sqlite3"

    def with_engine_limits(self, engine_limits: dict[str, object]) -> Settings:
        """Limits narrowed to what the engine accepts."""
        updates: dict[str, object] = {}
        for name in ("max_new_tokens", "max_prompt_rows", "max_reference_seconds"):
            value = engine_limits.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):  # the lower of the two
                updates[name] = type(getattr(self.limits, name))(min(value, getattr(self.limits, name)))
        return dataclasses.replace(self, limits=dataclasses.replace(self.limits, **updates))  # type: ignore[arg-type]

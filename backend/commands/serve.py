"""`retake serve`: the directing server (studio, /ws, /v1/audio/speech) under uvicorn.

The engine is loaded and warmed up before uvicorn starts listening, so a bad checkpoint is a
one-line error (exit 2) and the first visitor does not pay for compilation. Without
`--checkpoint` the tiny random-weight demo checkpoint runs on the CPU, and the log says so;
`--random-weights --preset full` serves the full-size model with random weights made on the
GPU (the serving path measured without real weights), flagged as demo weights the same way;
with `--converse` too, PersonaPlex gets random weights of `--size` (released: the 7B model on
the GPU, for `retake loadtest --converse`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.settings import Settings
    from backend.supervisor import Replica

NAME = "serve"
HELP = "run the directing studio: the web page, /ws sessions and POST /v1/audio/speech"


def default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "retake"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", help="a Drama 3 checkpoint directory or Hugging Face repo id (owner/name"
                                             "[@revision], from the local cache first); default: the tiny demo "
                                             "checkpoint with random weights, on the CPU")
    parser.add_argument("--random-weights", action="store_true",
                        help="serve a model of --preset with random weights made on the device instead of a "
                             "checkpoint (to measure the serving path without real weights; its audio is noise)")
    parser.add_argument("--preset", choices=("full", "tiny"), default="full",
                        help="with --random-weights: the model size (full: the assumed 35B-A3B dimensions, on a "
                             "GPU; tiny: the demo's; default full)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the engine runs (auto: CUDA if present; the demo checkpoint uses the CPU)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(),
                        help="where sessions and takes are stored (retake.sqlite3; default $XDG_DATA_HOME/retake)")
    parser.add_argument("--database", default=os.environ.get("RETAKE_DATABASE"), metavar="URL",
                        help="store sessions and takes in PostgreSQL instead (postgresql://user@host[:port]/db, "
                             "shared by replicas; the password from PGPASSWORD or ~/.pgpass; default "
                             "$RETAKE_DATABASE; none: SQLite under --data-dir)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="a name the server answers to (the Host header) besides localhost, IP addresses and "
                             "--host; pages on it are allowed too (repeatable)")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser origin (scheme://name[:port]) allowed besides the server's own "
                             "(repeatable; * = any)")
    parser.add_argument("--token", default=os.environ.get("RETAKE_TOKEN"),
                        help="require 'Authorization: Bearer TOKEN' (the studio: open /#token=TOKEN once) on the "
                             "sockets, the API and exports (default $RETAKE_TOKEN; none)")
    parser.add_argument("--first-window-frames", type=int,
                        help="frames in a take's first audio window (default 1: windows close at 1, 2, 4, 10, 20, "
                             "... frames; the seed's first is 10; smaller: earlier first audio)")
    parser.add_argument("--vocoder-order", choices=("deadline", "arrival"), default="deadline",
                        help="which queued windows the vocoder decodes first (default deadline: a take's first "
                             "window, then those whose takes' clients run out of audio soonest; arrival: first "
                             "windows first, then as they came)")
    parser.add_argument("--warms-yield", choices=("on", "off"), default="off",
                        help="the next lines' warms (prompts prefilled ahead while a director reads) wait while a "
                             "window in the vocoder's queue is due within two steps, so the steps beside it stay "
                             "short (default off until a GPU measures it: docs/perf.md)")
    parser.add_argument("--keep-warms", choices=("on", "off"), default="on",
                        help="a warm's snapshot in the prefix cache (the next line's prompt, prefilled ahead) is "
                             "evicted after every other snapshot until its take restores it, for 5 minutes at most "
                             "(default on; off: least recently used first, which drops the warms of directors "
                             "working in turn where the cache is short: docs/perf.md)")
    parser.add_argument("--prefill-group", type=int,
                        help="the most waiting prompts whose next prefill chunks run as one batched chunk (default: 8 "
                             "on a GPU, where a chunk costs about the same for 40 rows as for 93; 1, off, on a CPU, "
                             "which keeps its takes bit for bit those of one prompt at a time)")
    parser.add_argument("--mixed-step", choices=("on", "groups", "off"),
                        help="decode steps carry a waiting prompt's next chunk (up to 256 rows), the experts read "
                             "once for all, instead of running it between the steps (default: on on a GPU; off on a "
                             "CPU, which keeps its takes bit for bit those of one prompt at a time; groups: up to 8 "
                             "prompts' chunks of 64 or 128 rows in one step, where prefill groups are on)")
    parser.add_argument("--early-windows", choices=("on", "off"), default="off",
                        help="a take's window closes early, with the frames it has, where its client would otherwise "
                             "run out of audio before the next scheduled window (default off: on an H100 the extra "
                             "windows' vocoding delayed every take's windows and lost more than it saved, "
                             "docs/perf.md; off: windows close at 1, 2, 4, 10, 20, 32, 64, ... frames only)")
    parser.add_argument("--compile-prefill", action="store_true",
                        help="on a GPU, prefill chunks through the Inductor-compiled layers too (fused kernels in each "
                             "chunk's graph; a longer warm-up; off until measured)")
    parser.add_argument("--vocoder-compile", choices=("on", "off"), default="on",
                        help="on a GPU, the vocoder's window graphs capture the window's decode compiled by Inductor "
                             "(default on: its elementwise kernels fused, 14-18%% off each window and, on an H200, "
                             "32 directors' longest gap p99 39 ms against 77 op by op, docs/perf.md; off: a warm-up "
                             "~1-2 minutes shorter on a cold compile cache)")
    parser.add_argument("--kernels", nargs="*", metavar="NAME",
                        help="the decode step's Triton kernels on a GPU (default: deltanet_step moe_routing "
                             "cache_attention; see `retake bench decode --help` for the names); to measure one through "
                             "the server")
    parser.add_argument("--slots", type=int, help="takes that decode together in one batched step (default: as many as "
                                                  "the GPU's free memory holds, at most 64; 2 on a CPU); caps the "
                                                  "number on a GPU")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: half the cores on a CPU, so the "
                                                    "decode loop and the vocoder each have their own)")
    parser.add_argument("--prefix-cache-gib", type=float,
                        help="memory for snapshots of prompt prefixes, so a retake prefills only what is new (default: "
                             "half the GPU memory free after warm-up; 1 on a CPU; 0: off)")
    parser.add_argument("--prefix-cache-host-gib", type=float, default=0.0,
                        help="pinned host memory that snapshots evicted from the GPU move to (default 0: dropped)")
    parser.add_argument("--max-sessions", type=int, default=64, help="open directing sockets at once (default 64)")
    parser.add_argument("--max-queue", type=int, default=16, help="engine jobs that may wait (default 16)")
    parser.add_argument("--deadline-ms", type=int, default=120_000, help="a take's deadline when the client gives "
                                                                         "none (default 120000)")
    parser.add_argument("--max-deadline-ms", type=int, default=600_000, help="the longest deadline a client may "
                                                                             "ask for (default 600000)")
    parser.add_argument("--silence-seconds", type=float, default=2.0,
                        help="silence guard: audio silent this long at the start of a take is retried (default 2)")
    parser.add_argument("--silence-level", type=int, default=64,
                        help="silence guard: int16 peak at or below which audio is silent (default 64)")
    parser.add_argument("--silence-retries", type=int, default=2, help="silence guard: retries per take "
                                                                       "(default 2; 0 turns it off)")
    parser.add_argument("--converse", nargs="?", const="demo", default=None, metavar="DIR",
                        help="also serve live conversations on /converse with PersonaPlex from DIR (a checkpoint "
                             "directory or repo id; without DIR: the tiny demo checkpoint with random weights)")
    parser.add_argument("--size", choices=("released", "tiny"), default=None,
                        help="with --random-weights and --converse: PersonaPlex's size (released: the 7B "
                             "model with random weights made on the GPU, for load tests; labelled RANDOM like "
                             "--preset; default released on a GPU, tiny on a CPU)")
    parser.add_argument("--converse-slots", type=int, default=2,
                        help="conversations at once, ticked together in one batch (default 2)")
    parser.add_argument("--converse-compile", choices=("auto", "on", "off"), default="auto",
                        help="PersonaPlex's tick (Helium, depformer and Mimi layers) with its small ops compiled by "
                             "Inductor into fused kernels, or the eager modules (default auto: compiled on a GPU)")
    parser.add_argument("--drain-seconds", type=float, default=60.0,
                        help="on SIGTERM, how long running takes may go on while the replica drains (no new "
                             "takes; /health 503; sockets closed with 1012 to reconnect elsewhere) before it "
                             "stops (default 60); a second SIGTERM or SIGINT stops at once")
    parser.add_argument("--gpus", metavar="LIST",
                        help="one replica per GPU of this host (e.g. 0,1,2,3): a `retake serve` process each, "
                             "with its own engine, on --port, --port+1, ...; all share the store (use "
                             "--database for more than one host); put a load balancer in front (deploy/)")
    parser.add_argument("--replicas", type=int, metavar="N",
                        help="N replicas on this host's device, on --port, --port+1, ... (on the CPU: to try "
                             "the deployment without GPUs)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def settings_from(args: argparse.Namespace) -> Settings:
    from backend.cli import UsageError
    from backend.directing.jobs import SilenceGuard
    from backend.directing.protocol import Limits
    from backend.settings import Settings
    from engine.drama3.fast import KERNELS
    from engine.drama3.prefill_groups import PREFILL_GROUP

    for name in ("max_sessions", "max_queue", "deadline_ms", "max_deadline_ms"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be between 1 and 65535 (got {args.port})")
    if args.slots is not None and args.slots < 1:
        raise UsageError("--slots must be at least 1")
    if args.gpus is not None and args.replicas is not None:
        raise UsageError("give --gpus or --replicas, not both")
    if args.replicas is not None and args.replicas < 1:
        raise UsageError("--replicas must be at least 1")
    if not args.drain_seconds >= 0:
        raise UsageError("--drain-seconds must be at least 0")
    if args.converse_slots < 1:
        raise UsageError("--converse-slots must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be at least 1")
    if args.kernels is not None and (unknown := [name for name in args.kernels if name not in KERNELS]):
        raise UsageError(f"--kernels: unknown {', '.join(unknown)}; choose from {', '.join(KERNELS)}")
    if args.prefill_group is not None and not 1 <= args.prefill_group <= PREFILL_GROUP:
        raise UsageError(f"--prefill-group must be a whole number from 1 (off) to {PREFILL_GROUP}")
    for name in ("prefix_cache_gib", "prefix_cache_host_gib"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"--{name.replace('_', '-')} must be a number of GiB, at least 0")
    if args.deadline_ms > args.max_deadline_ms:
        raise UsageError("--deadline-ms must not be above --max-deadline-ms")
    if args.silence_seconds <= 0 or args.silence_retries < 0 or not 0 <= args.silence_level <= 32767:
        raise UsageError("--silence-seconds must be positive, --silence-retries at least 0, --silence-level in "
                         "[0, 32767]")
    limits = dataclasses.replace(Limits(), max_sessions=args.max_sessions, max_queue=args.max_queue,
                                 default_deadline_ms=args.deadline_ms, max_deadline_ms=args.max_deadline_ms)
    if args.random_weights and args.checkpoint is not None:
        raise UsageError("--random-weights and --checkpoint exclude each other")
    random_weights = args.preset if args.random_weights else None
    demo = args.checkpoint is None and random_weights is None
    device = "cpu" if (demo or random_weights == "tiny") and args.device == "auto" else args.device
    if random_weights == "full" and device == "cpu":
        raise UsageError("--random-weights --preset full needs a GPU (--device cuda); use --preset tiny on a CPU")
    conversation_random = None
    if args.size is not None and not (args.random_weights and args.converse is not None):
        raise UsageError("--size is PersonaPlex's size with --random-weights and --converse; give both or drop it")
    if args.random_weights and args.converse is not None:
        if args.converse != "demo":
            raise UsageError("--random-weights and --converse DIR exclude each other; drop DIR for random weights")
        import torch

        on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        conversation_random = args.size or ("tiny" if on_cpu else "released")
        if conversation_random == "released" and on_cpu:
            raise UsageError("--random-weights --size released needs a GPU (--device cuda); use --size tiny on a CPU")
    return Settings(data_dir=args.data_dir, database_url=args.database or None, checkpoint=args.checkpoint,
                    random_weights=random_weights, device=device, conversation_random=conversation_random,
                    first_window_frames=args.first_window_frames, prefill_group=args.prefill_group,
                    mixed_step=None if args.mixed_step is None else args.mixed_step != "off",
                    mixed_group=args.mixed_step == "groups",
                    early_windows=args.early_windows == "on", vocoder_order=args.vocoder_order,
                    warms_yield=args.warms_yield == "on", keep_warms=args.keep_warms == "on",
                    kernels=None if args.kernels is None else tuple(args.kernels),
                    compile_prefill=args.compile_prefill, vocoder_compile=args.vocoder_compile == "on",
                    slots=args.slots, threads=args.threads,
                    prefix_cache_gib=args.prefix_cache_gib, prefix_cache_host_gib=args.prefix_cache_host_gib,
                    host=args.host, allow_hosts=tuple(args.allow_host), allow_origins=tuple(args.allow_origin),
                    token=args.token or None, limits=limits,
                    silence=SilenceGuard(args.silence_seconds, args.silence_level, args.silence_retries),
                    conversation=args.converse, conversation_slots=args.converse_slots,
                    conversation_compiled=None if args.converse_compile == "auto" else args.converse_compile == "on")


def replicas_from(args: argparse.Namespace) -> list[Replica] | None:
    """The replicas --gpus or --replicas asks for (None: serve in this process)."""
    from backend.cli import UsageError
    from backend.supervisor import Replica

    if args.replicas is not None:
        return [Replica(k, None, args.port + k) for k in range(args.replicas)]
    if args.gpus is None:
        return None
    gpus = [g.strip() for g in args.gpus.split(",")]
    if not all(g.isdigit() for g in gpus) or len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus {args.gpus}: give distinct GPU indexes separated by commas, e.g. 0,1,2,3")
    import torch

    count = torch.cuda.device_count()
    if max(int(g) for g in gpus) >= count:
        have = "no CUDA GPU" if count == 0 else f"{count} CUDA GPU{'s' if count > 1 else ''} (0-{count - 1})"
        raise UsageError(f"--gpus {args.gpus}: this machine has {have}"
                         + ("; to try replicas on the CPU use --replicas N" if count == 0 else ""))
    return [Replica(k, gpu, args.port + k) for k, gpu in enumerate(gpus)]


def check_port(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port, or None. Checked before the engine loads (minutes
    on a GPU), with the SO_REUSEADDR uvicorn sets, so only a port really in use is refused."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as error:
        return error.strerror or str(error)
    return None


def check_checkpoints(settings: Settings) -> None:
    """Find the checkpoints and read their configs before anything loads: a Drama 3 load takes
    minutes on a GPU, and a bad `--converse DIR` would otherwise be found only after it (the
    same one-line CheckpointError the load would raise, now before it). A repo id not yet in
    the Hugging Face cache is downloaded here, as the load would."""
    from engine.checkpoints import resolve_checkpoint
    from engine.device import pick_device

    pick_device(settings.device)
    if settings.checkpoint is not None:
        from engine.drama3.checkpoint import HUB_PATTERNS, read_config

        read_config(resolve_checkpoint(settings.checkpoint, HUB_PATTERNS))
    if settings.conversation not in (None, "demo") and settings.conversation_random is None:
        from engine.personaplex.checkpoint import HUB_PATTERNS as CONVERSE_PATTERNS
        from engine.personaplex.checkpoint import read_config as read_conversation_config

        read_conversation_config(resolve_checkpoint(str(settings.conversation), CONVERSE_PATTERNS))


def run(args: argparse.Namespace) -> int:

    from backend import pauses
    from backend.app import build_app, log_ready, start_conversation_loop, start_engine_loop
    from backend.cli import UsageError
    from backend.draining import DrainingServer
    from backend.http_server import uvicorn_config
    from backend.store import NewerSchema, Unreachable, check_schema, describe

    settings = settings_from(args)
    database = settings.database
    replicas = replicas_from(args)
    try:  # before the engine loads: a database this version cannot use is a one-line error
        if isinstance(database, Path):
            database.parent.mkdir(parents=True, exist_ok=True)
        check_schema(database)
    except (NewerSchema, Unreachable) as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"--data-dir {settings.data_dir} cannot be used: {error.strerror or error}") from None
    if isinstance(database, Path) and not os.access(database.parent, os.W_OK):
        raise UsageError(f"--data-dir {database.parent} is not writable")
    for port in [args.port] if replicas is None else [r.port for r in replicas]:
        if (why := check_port(args.host, port)) is not None:
            raise UsageError(f"cannot listen on {args.host}:{port} ({why}); pick another --port or --host")
    check_checkpoints(settings)
    name = "retake" if (index := os.environ.get("RETAKE_REPLICA")) is None else f"retake {index}"
    logging.basicConfig(level=args.log_level.upper(), format=f"[{name}] %(message)s")
    # The balancer asks /health every second: not worth a log line each.
    logging.getLogger("uvicorn.access").addFilter(lambda record: "/health" not in record.getMessage())
    log = logging.getLogger("retake")
    if replicas is not None:
        from backend.supervisor import serve_argv, supervise

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return supervise(replicas, serve_argv(parser, args), args.host)
    what = (str(settings.checkpoint) if settings.checkpoint else
            f"random weights of the {settings.random_weights} preset (DEMO/RANDOM: its audio is noise)"
            if settings.random_weights else "the tiny demo checkpoint (random weights)")
    log.info("loading %s on %s", what, settings.device)
    engine_loop = start_engine_loop(settings)
    conversations = None
    try:
        log_ready(engine_loop)
        if settings.conversation is not None:
            conversations = start_conversation_loop(settings)
            talker = conversations.engine
            assert talker is not None
            log.info("conversations on /converse: PersonaPlex on %s, %d slots%s", talker.device, talker.slots,
                     "; DEMO WEIGHTS, its audio is noise" if talker.demo_weights else "")
        log.info("sessions are stored in %s", describe(settings.database))
        if not (settings.static_dir / "index.html").is_file():
            log.warning("the studio is not built (%s is missing): run npm run build", settings.static_dir)
        log.info("serving on http://%s:%d", args.host, args.port)
        if args.host in ("0.0.0.0", "::") and not args.allow_host:
            log.info("on every address: browsers may use an IP address; add --allow-host NAME for a host name")
        app = build_app(settings, engine_loop, conversations)
        log.info("garbage collector: the warm-up's %s objects frozen (gc.freeze: collections skip them); "
                 "a collection that holds the threads %d ms or more is logged", f"{pauses.freeze():,}",
                 round(pauses.LONG_S * 1000))
        config = uvicorn_config(app, settings, host=args.host, port=args.port, log_level=args.log_level)
        server = DrainingServer(config, app, args.drain_seconds)
        server.run()
    finally:
        engine_loop.stop()
        if conversations is not None:
            conversations.stop()
    if not server.started:  # uvicorn logged why (the port is taken, say) and gave up
        raise UsageError(f"could not serve on {args.host}:{args.port}; see the message above")
    return 0

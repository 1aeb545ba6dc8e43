"""`retake deploy`: the deployment on one host, without docker: PostgreSQL, the replicas
(`retake serve --gpus` or `--replicas`) and HAProxy in front, started in that order and
stopped in the reverse one.

Design choices:
- Only existing parts: Debian's PostgreSQL (started here in `--state-dir`, or any server given
  with `--database`), HAProxy with deploy/haproxy.cfg, and `retake serve` itself; this module
  only starts, watches and stops them. HAProxy listens on --host:--port; replica k on
  127.0.0.1:--port+1+k, reachable only through it.
- The first SIGTERM (or Ctrl-C) drains: the replicas get SIGTERM (running takes finish,
  sockets are told to reconnect), then HAProxy and PostgreSQL stop. A part that exits on its
  own stops the rest (the supervisor already restarts a replica that dies).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

NAME = "deploy"
HELP = "run the deployment on this host: PostgreSQL, one replica per GPU (or N on the CPU) and HAProxy in front"
HAPROXY_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy.cfg"


def default_state_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "retake" / "deploy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    replicas = parser.add_mutually_exclusive_group(required=True)
    replicas.add_argument("--gpus", metavar="LIST", help="one replica per GPU of this host, e.g. 0,1,2,3")
    replicas.add_argument("--replicas", type=int, metavar="N", help="N replicas on this host's device (CPU: to try it)")
    parser.add_argument("--host", default="127.0.0.1", help="where HAProxy listens (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000,
                        help="HAProxy's port (default 8000); the replicas take the next ports, on 127.0.0.1")
    parser.add_argument("--state-dir", type=Path, default=default_state_dir(),
                        help="PostgreSQL's data and HAProxy's server list (default $XDG_DATA_HOME/retake/deploy)")
    parser.add_argument("--database", metavar="URL",
                        help="a PostgreSQL database to use instead of starting one (postgresql://user@host/db)")
    parser.add_argument("--haproxy-config", type=Path, default=HAPROXY_CONFIG,
                        help="HAProxy's settings (default: deploy/haproxy.cfg of this checkout)")
    parser.add_argument("serve", nargs=argparse.REMAINDER, metavar="-- SERVE OPTIONS",
                        help="options for every `retake serve` replica after --, e.g. -- --checkpoint DIR")


def ready(url: str, names: set[str], parts: list[subprocess.Popen[bytes]], stopping: list[int]) -> bool:
    """Wait until every replica answered `url` through the balancer (its name in X-Retake-Replica;
    any answer, with a config that does not name them): True; False if a part exits or a signal came."""
    seen: set[str] = set()
    while not stopping and all(part.poll() is None for part in parts):
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                name = reply.headers.get("X-Retake-Replica")
                if name is None or seen.union([name]) >= names:
                    return True
                if name not in seen:
                    seen.add(name)
                    continue  # leastconn takes turns among idle replicas: ask again at once
        except OSError:
            pass
        time.sleep(0.25)
    return False


def run(args: argparse.Namespace) -> int:
    import logging

    from backend.cli import UsageError
    from backend.commands.serve import check_port
    from backend.supervisor import dies_with_parent
    from backend.tools.postgres import MISSING, LocalPostgres, binaries

    serve = args.serve[1:] if args.serve[:1] == ["--"] else args.serve
    count = args.replicas if args.replicas is not None else len(args.gpus.split(","))
    if count < 1:
        raise UsageError("--replicas must be at least 1")
    if (haproxy := shutil.which("haproxy")) is None:
        raise UsageError("HAProxy is not installed (Debian: apt-get install -y haproxy)")
    if not args.haproxy_config.is_file():
        raise UsageError(f"--haproxy-config {args.haproxy_config} is not a file")
    if args.database is None and binaries() is None:
        raise UsageError(f"{MISSING}; or give --database")
    for host, port in [(args.host, args.port), *(("127.0.0.1", args.port + 1 + k) for k in range(count))]:
        if (why := check_port(host, port)) is not None:
            raise UsageError(f"cannot listen on {host}:{port} ({why}); pick another --port")
    logging.basicConfig(level="INFO", format="[retake] %(message)s")
    log = logging.getLogger("retake")
    args.state_dir.mkdir(parents=True, exist_ok=True)

    stopping: list[int] = []
    postgres: LocalPostgres | None = None
    replicas: subprocess.Popen[bytes] | None = None
    balancer: subprocess.Popen[bytes] | None = None

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        stopping.append(sig)
        if len(stopping) > 1 and replicas is not None and replicas.poll() is None:
            replicas.send_signal(sig)  # again, while they drain: stop now

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        database = args.database
        if database is None:
            postgres = LocalPostgres(args.state_dir / "postgres", preexec_fn=dies_with_parent(signal.SIGINT))
            database = postgres.create_database("retake")
            log.info("PostgreSQL in %s: %s", postgres.folder, database)
        which = ["--replicas", str(args.replicas)] if args.replicas is not None else ["--gpus", args.gpus]
        replicas = subprocess.Popen(
            [sys.executable, "-m", "backend.cli", "serve", *which, "--host", "127.0.0.1", "--port",
             str(args.port + 1), "--database", database, *serve],
            start_new_session=True, preexec_fn=dies_with_parent())
        servers = args.state_dir / "replicas.cfg"
        servers.write_text("backend replicas\n" + "".join(
            f"    server replica{k} 127.0.0.1:{args.port + 1 + k} check\n" for k in range(count)))
        balancer = subprocess.Popen([haproxy, "-db", "-f", str(args.haproxy_config), "-f", str(servers)],
                                    env={**os.environ, "RETAKE_BIND": f"{args.host}:{args.port}"},
                                    start_new_session=True, preexec_fn=dies_with_parent())
        # As long as it takes (a GPU replica's warm-up takes minutes).
        names = {f"replica{k}" for k in range(count)}
        if ready(f"http://{args.host}:{args.port}/health", names, [replicas, balancer], stopping):
            log.info("deployment ready: http://%s:%d (HAProxy) in front of %d replicas; Ctrl-C or SIGTERM drains "
                     "and stops it", args.host, args.port, count)
        while not stopping:
            if replicas.poll() is not None or balancer.poll() is not None:
                gone = "the replicas" if replicas.poll() is not None else "HAProxy"
                log.error("%s stopped; stopping the rest", gone)
                code = 1 if replicas.returncode in (None, 0) else replicas.returncode
                break
            time.sleep(0.2)
    finally:
        if replicas is not None and replicas.poll() is None:
            replicas.send_signal(signal.SIGINT if stopping[:1] == [signal.SIGINT] else signal.SIGTERM)
            log.info("stopping: the replicas drain, then HAProxy and PostgreSQL stop")
            replicas.wait()
        if balancer is not None and balancer.poll() is None:
            balancer.terminate()
            balancer.wait()
        if postgres is not None:
            postgres.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code

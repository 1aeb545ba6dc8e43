"""A PostgreSQL server of our own, from Debian's `postgresql` package: for `retake deploy` on one
host (kept in its state folder) and for the tests (a throwaway one in a temporary folder).

Design choices:
- `initdb` once into `folder/data`, then `postgres` as a child process listening only on a
  unix socket in `folder` (no TCP port to collide with anything, nothing reachable from
  outside). PostgreSQL refuses to run as root, so as root it runs as the package's `postgres`
  user (or `nobody` where the package's scripts never ran), which owns the folder.
- `durable=False` (tests) turns fsync and full page writes off: a test server only has to
  survive its clients dying, not the machine.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

MISSING = "PostgreSQL is not installed (Debian: apt-get install -y postgresql)"
USER = "retake"  # the database superuser initdb makes (trust authentication, unix socket only)


def binaries() -> Path | None:
    """The folder with initdb and postgres: Debian's /usr/lib/postgresql/N/bin (newest), or PATH."""
    found = [Path(f) for f in glob.glob("/usr/lib/postgresql/*/bin") if (Path(f) / "initdb").is_file()]
    if found:
        return max(found, key=lambda f: int(f.parent.name) if f.parent.name.isdigit() else 0)
    initdb = shutil.which("initdb")
    return None if initdb is None else Path(initdb).resolve().parent


class LocalPostgres:
    def __init__(self, folder: Path, *, durable: bool = True, bindir: Path | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        bindir = bindir or binaries()
        if bindir is None:
            raise FileNotFoundError(MISSING)
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        user = None
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")  # the Debian package's user
            except KeyError:  # the binaries unpacked without the package's scripts
                account = pwd.getpwnam("nobody")
            os.chown(folder, account.pw_uid, account.pw_gid)
            user = account.pw_name
        data = folder / "data"
        if not (data / "PG_VERSION").is_file():
            subprocess.run([bindir / "initdb", "-D", data, "-U", USER, "--auth=trust", "-E", "UTF8",
                            *([] if durable else ["--no-sync"])],
                           user=user, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        fast = [] if durable else ["-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"]
        self.log = open(folder / "postgres.log", "ab")  # closed in stop()
        self.process = subprocess.Popen(
            [bindir / "postgres", "-D", data, "-k", folder, "-c", "listen_addresses=", "-c", "max_connections=200",
             *fast], user=user, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=preexec_fn)
        deadline = time.monotonic() + 120  # generous: a loaded 2-core machine
        while subprocess.run([bindir / "pg_isready", "-q", "-h", folder, "-d", "postgres"]).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not start: {(folder / 'postgres.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@/{database}?host={self.folder}"

    def create_database(self, name: str) -> str:
        """The database (made now if it is not there yet); its URL."""
        import psycopg

        with psycopg.connect(f"host={self.folder} user={USER} dbname=postgres", autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown: disconnects clients, no checkpoint wait
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

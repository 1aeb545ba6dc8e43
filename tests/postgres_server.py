"""A real, throwaway PostgreSQL server for the tests (Debian's `postgresql` package).

`initdb` into a temporary folder, then `postgres` listening only on a unix socket in that
folder (no TCP port to collide with anything), as the `postgres` user when the tests run as
root (PostgreSQL refuses to run as root). Durability is off (fsync, full page writes): a test
server only has to survive its client processes dying, not the machine. Each test gets a new
database of its own (`database()`), so tests never see each other's rows.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

MISSING = ("PostgreSQL is not installed (Debian: apt-get install -y postgresql; scripts/test installs it "
           "when run as root)")


def binaries() -> Path | None:
    """The folder with initdb and postgres: Debian's /usr/lib/postgresql/N/bin (newest), or PATH."""
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda f: int(Path(f).parent.name),
                         reverse=True):
        if (Path(folder) / "initdb").is_file():
            return Path(folder)
    initdb = shutil.which("initdb")
    return None if initdb is None else Path(initdb).resolve().parent


class PostgresServer:
    def __init__(self, bindir: Path) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="retake-postgres-"))
        user = None
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")  # the Debian package's user
            os.chown(self.folder, account.pw_uid, account.pw_gid)
            user = account.pw_name
        data = self.folder / "data"
        subprocess.run([bindir / "initdb", "-D", data, "-U", "retake", "--auth=trust", "--no-sync", "-E", "UTF8"],
                       user=user, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.log = open(self.folder / "postgres.log", "wb")  # closed in stop()
        self.process = subprocess.Popen(
            [bindir / "postgres", "-D", data, "-k", self.folder, "-c", "listen_addresses=", "-c", "fsync=off",
             "-c", "full_page_writes=off", "-c", "synchronous_commit=off", "-c", "max_connections=200"],
            user=user, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.names = itertools.count()
        self.wait_ready(bindir)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://retake@/{database}?host={self.folder}"

    def wait_ready(self, bindir: Path) -> None:
        deadline = time.monotonic() + 120  # generous: a loaded 2-core machine
        while subprocess.run([bindir / "pg_isready", "-q", "-h", self.folder, "-d", "postgres"]).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not start: {(self.folder / 'postgres.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"test_{next(self.names)}"
        with psycopg.connect(f"host={self.folder} user=retake dbname=postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
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
        shutil.rmtree(self.folder, ignore_errors=True)

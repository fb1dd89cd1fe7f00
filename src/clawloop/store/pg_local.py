"""A throwaway PostgreSQL server in a temp folder: what `make test-postgres` and `bench/multi_gateway.py` run
the PostgreSQL store against (a real server, Debian's `postgresql` binaries; no mock).

    with LocalPostgres() as pg:          # initdb + postgres on 127.0.0.1:<free port>
        store = open_store(pg.url)       # postgresql://postgres@127.0.0.1:PORT/postgres
        url2 = pg.create_database("t1")  # a fresh database per test

`initdb` refuses to run as root, so under root the cluster belongs to the `postgres` system user (run through
`runuser`). The server's PID is kept; `stop()` stops exactly that process (SIGINT: PostgreSQL's fast shutdown,
then SIGKILL after a timeout) and removes the folder. The server is started with `fsync=off`: a test cluster
that lives for one run needs no durability, and a 2-core CI machine's disk is the bottleneck otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BIN_DIRS = tuple(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)) if Path(
    "/usr/lib/postgresql").is_dir() else ()


def find_bin(name: str) -> str | None:
    """`initdb`/`postgres` from PATH, else Debian's versioned folder (the newest)."""
    found = shutil.which(name)
    if found:
        return found
    for d in BIN_DIRS:
        if (d / name).is_file():
            return str(d / name)
    return None


def missing() -> str:
    """Why no local server can start here ('' when one can): the binaries, or the driver."""
    if find_bin("initdb") is None or find_bin("postgres") is None:
        return "PostgreSQL's initdb/postgres not found (Debian package postgresql; `make sysdeps`)"
    if os.geteuid() == 0 and (shutil.which("runuser") is None or not _user_exists("postgres")):
        return "running as root needs the `postgres` system user and runuser (initdb refuses root)"
    try:
        import psycopg  # noqa: F401  (the optional driver: pip install 'clawloop[postgres]')
    except ImportError:
        return "the psycopg driver is not installed (pip install -e '.[postgres]')"
    return ""


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class LocalPostgres:
    """initdb + postgres in a temp folder, on 127.0.0.1 and a free port; `stop()` stops exactly that PID."""

    def __init__(self, port: int | None = None, max_connections: int = 200):
        self.port = port or _free_port()
        self.max_connections = max_connections
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.user = "postgres"

    @property
    def url(self) -> str:
        return self.url_of("postgres")

    def url_of(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def _as_owner(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] + argv if os.geteuid() == 0 else argv

    def start(self, timeout: float = 60.0) -> "LocalPostgres":
        why = missing()
        if why:
            raise RuntimeError(why)
        self.dir = Path(tempfile.mkdtemp(prefix="clawloop-pg-"))
        data, sock = self.dir / "data", self.dir / "sock"
        sock.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            shutil.chown(sock, "postgres")
        else:
            import getpass

            self.user = getpass.getuser()
        subprocess.run(self._as_owner([find_bin("initdb"), "-D", str(data), "-U", self.user, "-A", "trust",
                                       "-E", "UTF8", "--no-sync"]),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log = open(self.dir / "postgres.log", "wb")
        self.proc = subprocess.Popen(
            self._as_owner([find_bin("postgres"), "-D", str(data), "-k", str(sock), "-p", str(self.port),
                            "-h", "127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
                            "-c", "full_page_writes=off", "-c", f"max_connections={self.max_connections}",
                            "-c", "shared_buffers=64MB"]),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                text = (self.dir / "postgres.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"postgres exited at start: {text}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if self._ready():
                    return self
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("postgres did not start in time")
            time.sleep(0.1)

    def _ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=2):
                return True
        except psycopg.OperationalError:  # "the database system is starting up"
            return False

    def create_database(self, name: str) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def stop(self, timeout: float = 20.0) -> None:
        """Fast shutdown of exactly the server started here (under runuser: that process's group), then
        the folder is removed."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            # runuser forwards signals to postgres; the group (start_new_session) is the server's own
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

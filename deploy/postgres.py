"""A throwaway PostgreSQL cluster for Dagster's run/event/schedule storage.

Debian's PostgreSQL binaries, a fresh cluster in a temp dir, on 127.0.0.1 and a free port, with
a generated password (scram-sha-256). Postgres refuses to run as root, so as root initdb and
pg_ctl run as the `postgres` user (runuser). On a real cluster this is a managed database
instead; only the DAGSTER_PG_* variables change.
"""
from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

USER = "dagster"
DB = "dagster"


def bindir() -> Path | None:
    """The newest installed PostgreSQL bin dir (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def unavailable_reason() -> str | None:
    """None when a cluster can be started here, else why not."""
    b = bindir()
    if b is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    if os.geteuid() == 0 and not shutil.which("runuser"):
        return "running as root without runuser, so postgres cannot be started as its own user"
    if os.geteuid() == 0:
        try:
            import pwd
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run the server as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    root: str          # temp dir holding data/, the socket dir and the log
    port: int
    password: str
    user: str = USER
    db: str = DB
    host: str = "127.0.0.1"

    @property
    def data(self) -> Path:
        return Path(self.root) / "data"

    @property
    def log(self) -> Path:
        return Path(self.root) / "postgres.log"

    def env(self) -> dict[str, str]:
        """What deploy/dagster.yaml reads (dagster_postgres config from env vars)."""
        return {"DAGSTER_PG_HOST": self.host, "DAGSTER_PG_PORT": str(self.port),
                "DAGSTER_PG_USERNAME": self.user, "DAGSTER_PG_PASSWORD": self.password,
                "DAGSTER_PG_DB": self.db}

    def connect(self):
        import psycopg2
        return psycopg2.connect(host=self.host, port=self.port, user=self.user,
                                password=self.password, dbname=self.db, connect_timeout=10)

    def as_dict(self) -> dict:
        return asdict(self)


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _run(cmd: list[str], what: str, env: dict | None = None) -> None:
    r = subprocess.run(_as_postgres(cmd), check=False, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-800:]}")


def start(parent: str | os.PathLike | None = None, port: int | None = None) -> Cluster:
    """initdb + start a cluster; raises RuntimeError with the server's words when it cannot."""
    why = unavailable_reason()
    if why:
        raise RuntimeError(why)
    b = bindir()
    root = Path(tempfile.mkdtemp(prefix="ratchet-pg-", dir=parent))
    c = Cluster(root=str(root), port=port or free_port(), password=secrets.token_urlsafe(18))
    pwfile = root / "pw"
    pwfile.write_text(c.password + "\n")
    if os.geteuid() == 0:
        import pwd
        pg = pwd.getpwnam("postgres")
        os.chown(root, pg.pw_uid, pg.pw_gid)
        os.chown(pwfile, pg.pw_uid, pg.pw_gid)
    os.chmod(pwfile, 0o600)
    try:
        _run([str(b / "initdb"), "-D", str(c.data), "-U", c.user, f"--pwfile={pwfile}",
              "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"], "initdb")
        pwfile.unlink()
        # Loopback only, socket in our own dir (not /var/run/postgresql, which may be absent).
        # fsync off: the cluster is throwaway; a real deployment uses a managed, durable Postgres.
        opts = (f"-p {c.port} -k {root} -c listen_addresses={c.host} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
        _run([str(b / "pg_ctl"), "-D", str(c.data), "-l", str(c.log), "-o", opts, "-w", "-t", "60",
              "start"], "pg_ctl start")
        _run([str(b / "createdb"), "-h", str(root), "-p", str(c.port), "-U", c.user, c.db],
             "createdb", env={"PGPASSWORD": c.password})
    except BaseException:
        stop(c)
        raise
    return c


def stop(c: Cluster) -> None:
    """Stop the server (fast shutdown) and delete its temp dir."""
    b = bindir()
    if b and (c.data / "postmaster.pid").exists():
        subprocess.run(_as_postgres([str(b / "pg_ctl"), "-D", str(c.data), "-m", "fast", "-w",
                                     "-t", "30", "stop"]), check=False, capture_output=True, timeout=60)
    shutil.rmtree(c.root, ignore_errors=True)

"""Bring Ratchet's production stack up on this machine, for real, and tear it down.

    python -m deploy up [--state DIR] [--home RATCHET_HOME] [--webserver-port N]
    python -m deploy launch ingest_job [--state DIR]     # a run through the DockerRunLauncher
    python -m deploy down [--state DIR]

`up`: the Docker engine and its local base image (sandboxes.docker_engine), a throwaway
PostgreSQL cluster (deploy/postgres.py), the code location image built offline FROM the base
(deploy/Dockerfile), DAGSTER_HOME holding deploy/dagster.yaml with the pool limits set in
Postgres, then three containers on the host network: the gRPC code server, the daemon (which
launches every run in its own container), and optionally the webserver. It writes
STATE/env.sh (source it to use `dagster` against the stack) and STATE/state.json (for `down`).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import uuid
from pathlib import Path

from deploy import postgres

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
IMAGE_REPO = "ratchet-code"
LABEL = "ratchet.deploy"                  # every container of a stack carries LABEL=<stack id>
PACKAGES = ("ratchet", "sandboxes", "assets", "resources", "pipelines")
# Every pool the assets name (`pool=` in assets/), one slot each: `warehouse` (DuckDB allows one
# writer process per file), `sandbox` (holdout_eval, whose episode pool uses every core),
# `training` (sft/dpo/rl_checkpoint: one trainer at a time on the machine).
# tests/deploy checks that this covers every pool of pipelines.definitions.
POOL_LIMITS = {"sandbox": 1, "training": 1, "warehouse": 1}
SITE_IN_IMAGE = "/opt/venv/site-packages"
DEFAULT_STATE = Path(os.environ.get("RATCHET_DEPLOY_STATE", ROOT / ".ratchet" / "deploy"))


# -- the image --------------------------------------------------------------------------------

def _context_files() -> list[str]:
    """The project's source (tracked and untracked-not-ignored) plus built extension modules,
    which are git-ignored but needed at run time (the image has no compiler)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *PACKAGES,
                          "pyproject.toml", "setup.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    files = {f for f in out if f and (ROOT / f).is_file() and "__pycache__" not in f}
    for pkg in PACKAGES:
        files.update(str(p.relative_to(ROOT)) for p in (ROOT / pkg).rglob("*.so"))
    return sorted(files)


def build_context() -> tuple[bytes, str]:
    """A deterministic tar of the build context and its content hash (the image tag)."""
    buf = io.BytesIO()
    digest = hashlib.sha256()
    extra = {"Dockerfile": DEPLOY / "Dockerfile", "deploy/workspace.yaml": DEPLOY / "workspace.yaml",
             "deploy/dagster.yaml": DEPLOY / "dagster.yaml"}
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, path in [*((f, ROOT / f) for f in _context_files()), *extra.items()]:
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755 if os.access(path, os.X_OK) else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
            digest.update(name.encode() + b"\0" + data)
    return buf.getvalue(), digest.hexdigest()[:12]


def build_image(client, base: str) -> tuple[str, bool]:
    """Build ratchet-code:<hash of context and base> offline; (image, built_now)."""
    context, digest = build_context()
    tag = hashlib.sha256(f"{digest} {base}".encode()).hexdigest()[:12]
    image = f"{IMAGE_REPO}:{tag}"
    import docker
    try:
        client.images.get(image)
        return image, False
    except docker.errors.ImageNotFound:
        pass  # not built yet: build it below
    log = []
    # network_mode none: dockerd here has no bridge, and the build must not need a network.
    for chunk in client.api.build(fileobj=io.BytesIO(context), custom_context=True, tag=image,
                                  buildargs={"BASE": base}, network_mode="none", rm=True,
                                  forcerm=True, pull=False, decode=True):
        if "error" in chunk:
            raise RuntimeError(f"docker build of {image} failed: {chunk['error'].strip()}\n{''.join(log[-20:])}")
        log.append(chunk.get("stream", ""))
    _prune_old_images(client, keep=image)
    return image, True


def _prune_old_images(client, keep: str, min_age_s: float = 3600) -> None:
    """Each source change gets a new tag; drop tags older than an hour that no container uses
    (a stack still running on one keeps it: removal fails and is ignored)."""
    from contextlib import suppress
    from datetime import UTC, datetime
    now = datetime.now(UTC)
    for img in client.images.list(name=IMAGE_REPO):
        if keep in img.tags:
            continue
        with suppress(Exception):  # in use by a container, or already gone
            created = datetime.fromisoformat(img.attrs["Created"][:19]).replace(tzinfo=UTC)
            if (now - created).total_seconds() > min_age_s:
                client.images.remove(img.id)


def site_packages() -> Path:
    """The venv's site-packages that the containers mount read-only (their Python deps)."""
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError(f"the base image has CPython 3.11; this venv is {sys.version.split()[0]}")
    return Path(sysconfig.get_paths()["purelib"]).resolve()


def docker_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        raise RuntimeError(f"the daemon container needs a unix socket to reach dockerd, not {host}")
    return host[len("unix://"):]


# -- up / down --------------------------------------------------------------------------------

def _container_context(sid: str, home: Path, dagster_home: Path) -> dict:
    """Mounts and labels for every container of this code location, runs included (the code
    server hands this to the DockerRunLauncher, which merges it with deploy/dagster.yaml).
    Host paths are mounted at the same path, so what runs record stays valid on the host."""
    return {"docker": {"container_kwargs": {
        "volumes": {str(site_packages()): {"bind": SITE_IN_IMAGE, "mode": "ro"},
                    str(home): {"bind": str(home), "mode": "rw"},
                    str(dagster_home): {"bind": str(dagster_home), "mode": "rw"}},
        "labels": {LABEL: sid}}}}


def _run_container(client, image: str, name: str, command: list[str], env: dict, sid: str,
                   volumes: dict):
    return client.containers.run(image, command, name=name, detach=True, network_mode="host",
                                 environment=env, volumes=volumes, labels={LABEL: sid},
                                 working_dir="/opt/ratchet")


def _wait_log(container, needle: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        container.reload()
        logs = container.logs().decode(errors="replace")
        if needle in logs:
            return
        if container.status in ("exited", "dead"):
            raise RuntimeError(f"container {container.name} exited: {logs[-1500:]}")
        time.sleep(0.5)
    raise RuntimeError(f"container {container.name} did not log {needle!r} in {timeout:.0f} s: "
                       f"{container.logs().decode(errors='replace')[-1500:]}")


def set_pool_limits(env: dict, limits: dict[str, int] = POOL_LIMITS) -> None:
    """Create Dagster's tables in Postgres and set the pool limits (what `dagster instance
    concurrency set POOL N` does), once, before any container starts."""
    code = ("import json, sys; from dagster import DagsterInstance\n"
            "i = DagsterInstance.get()\n"
            "for pool, n in json.loads(sys.argv[1]).items(): i.event_log_storage.set_concurrency_slots(pool, n)\n")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(limits)], check=False, env={**os.environ, **env},
                       capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        raise RuntimeError(f"setting the pool limits failed: {r.stderr.strip()[-1500:]}")


def up(state: str | os.PathLike = DEFAULT_STATE, home: str | os.PathLike | None = None,
       webserver_port: int | None = None, code_port: int | None = None) -> dict:
    """Bring the stack up; returns the state (also written to STATE/state.json)."""
    from sandboxes import docker_engine

    t0 = time.monotonic()
    state_dir = Path(state).resolve()
    if (state_dir / "state.json").exists():
        raise RuntimeError(f"a stack is already up at {state_dir} (python -m deploy down first)")
    reason, _ = docker_engine.ensure()
    if reason:
        raise RuntimeError(f"no Docker here: {reason}")
    why = postgres.unavailable_reason()
    if why:
        raise RuntimeError(f"no PostgreSQL here: {why}")
    sid = uuid.uuid4().hex[:10]
    home = Path(home or state_dir / "home").resolve()
    dagster_home = state_dir / "dagster_home"
    for d in (home, dagster_home):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DEPLOY / "dagster.yaml", dagster_home / "dagster.yaml")
    st: dict = {"id": sid, "state_dir": str(state_dir), "timings": {}}
    client = docker_engine.client(120)
    try:
        cluster = postgres.start()
        st["postgres"] = cluster.as_dict()
        (state_dir / "state.json").write_text(json.dumps(st, indent=1))  # `down` works from here on
        st["timings"]["postgres_s"] = round(time.monotonic() - t0, 1)
        t1 = time.monotonic()
        image, built = build_image(client, docker_engine.BASE_IMAGE)
        st.update(image=image, image_built=built)
        st["timings"]["image_s"] = round(time.monotonic() - t1, 1)
        code_port = code_port or postgres.free_port()
        env = {**cluster.env(), "DAGSTER_HOME": str(dagster_home), "RATCHET_HOME": str(home),
               "RATCHET_DEPLOY_IMAGE": image, "RATCHET_CODE_SERVER_HOST": "127.0.0.1",
               "RATCHET_CODE_SERVER_PORT": str(code_port),
               "RATCHET_MLFLOW_UI_URL": os.environ.get("RATCHET_MLFLOW_UI_URL", "http://127.0.0.1:5000"),
               "DAGSTER_DISABLE_TELEMETRY": "true", "MLFLOW_DISABLE_TELEMETRY": "true"}
        st["env"] = env
        t2 = time.monotonic()
        set_pool_limits(env)
        st["timings"]["instance_s"] = round(time.monotonic() - t2, 1)
        ctx = _container_context(sid, home, dagster_home)
        mounts = dict(ctx["docker"]["container_kwargs"]["volumes"])
        t3 = time.monotonic()
        code = _run_container(
            client, image, f"ratchet-code-{sid}",
            ["python3", "-m", "dagster", "api", "grpc", "--module-name", "pipelines.definitions",
             "--attribute", "defs", "--working-directory", "/opt/ratchet", "--host", "127.0.0.1",
             "--port", str(code_port), "--location-name", "ratchet", "--use-python-environment-entry-point"],
            {**env, "DAGSTER_CURRENT_IMAGE": image, "DAGSTER_CONTAINER_CONTEXT": json.dumps(ctx)},
            sid, mounts)
        _wait_log(code, "Started Dagster code server", 120)
        st["timings"]["code_server_s"] = round(time.monotonic() - t3, 1)
        sock = docker_socket()
        daemon = _run_container(
            client, image, f"ratchet-daemon-{sid}",
            ["python3", "-m", "dagster._daemon", "run", "-w", "/opt/ratchet/deploy/workspace.yaml"],
            env, sid, {**mounts, sock: {"bind": "/var/run/docker.sock", "mode": "rw"}})
        st["containers"] = {"code_server": code.name, "daemon": daemon.name}
        if webserver_port:
            web = _run_container(
                client, image, f"ratchet-webserver-{sid}",
                ["python3", "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(webserver_port),
                 "-w", "/opt/ratchet/deploy/workspace.yaml"], env, sid, mounts)
            st["containers"]["webserver"] = web.name
            st["webserver_url"] = f"http://127.0.0.1:{webserver_port}"
        st["timings"]["up_s"] = round(time.monotonic() - t0, 1)
    except BaseException:
        client.close()
        down(state_dir)
        raise
    client.close()
    (state_dir / "state.json").write_text(json.dumps(st, indent=1))
    (state_dir / "env.sh").write_text(env_sh(st))
    os.chmod(state_dir / "env.sh", 0o600)   # it holds the Postgres password
    return st


def env_sh(st: dict) -> str:
    lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(st["env"].items())]
    return "# source me: dagster commands then talk to the deployed stack\n" + "\n".join(lines) + "\n"


def load_state(state: str | os.PathLike = DEFAULT_STATE) -> dict:
    return json.loads((Path(state).resolve() / "state.json").read_text())


def launch(st: dict, job: str, config: dict | None = None, tags: dict | None = None) -> str:
    """`dagster job launch` against the stack (queued; the daemon starts its container)."""
    run_id = str(uuid.uuid4())
    cmd = [str(Path(sys.executable).with_name("dagster")), "job", "launch",
           "-w", str(DEPLOY / "workspace.yaml"), "-l", "ratchet", "-j", job, "--run-id", run_id,
           "--tags", json.dumps({"ratchet/launched_by": "deploy", **(tags or {})})]
    if config:
        cmd += ["--config-json", json.dumps(config)]
    r = subprocess.run(cmd, check=False, env={**os.environ, **st["env"]}, capture_output=True,
                       text=True, timeout=180, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"dagster job launch {job} failed: {(r.stderr or r.stdout).strip()[-1500:]}")
    return run_id


def wait_run(st: dict, run_id: str, timeout: float = 240) -> str:
    """Poll the run's status in Postgres until it finishes; returns the final status."""
    cluster = postgres.Cluster(**st["postgres"])
    end = time.monotonic() + timeout
    status = None
    while time.monotonic() < end:
        with cluster.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
            row = cur.fetchone()
        conn.close()
        status = row[0] if row else None
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(1)
    raise TimeoutError(f"run {run_id} still {status} after {timeout:.0f} s")


def down(state: str | os.PathLike = DEFAULT_STATE, remove_state: bool = True) -> list[str]:
    """Remove this stack's containers (runs included), stop Postgres, delete the state dir.
    The image stays cached (it is keyed by content)."""
    state_dir = Path(state).resolve()
    try:
        st = json.loads((state_dir / "state.json").read_text())
    except (OSError, ValueError):
        return [f"no stack at {state_dir}"]
    done = []
    try:
        from sandboxes import docker_engine
        client = docker_engine.client(60)
        for c in client.containers.list(all=True, filters={"label": f"{LABEL}={st['id']}"}):
            c.remove(force=True)
            done.append(f"removed container {c.name}")
        client.close()
    except Exception as e:  # noqa: BLE001 - still stop Postgres and clean up
        done.append(f"containers not removed: {e}")
    if st.get("postgres"):
        postgres.stop(postgres.Cluster(**st["postgres"]))
        done.append(f"stopped postgres on port {st['postgres']['port']}")
    (state_dir / "state.json").unlink(missing_ok=True)
    if remove_state:
        shutil.rmtree(state_dir, ignore_errors=True)
    return done


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="bring the stack up and print its environment")
    u.add_argument("--home", help="RATCHET_HOME for the runs (default STATE/home)")
    u.add_argument("--webserver-port", type=int, help="also start the Dagster webserver here")
    la = sub.add_parser("launch", help="launch a job through the DockerRunLauncher and wait")
    la.add_argument("job")
    la.add_argument("--config-json", help="run config as JSON")
    d = sub.add_parser("down", help="remove containers, stop Postgres, delete the state dir")
    d.add_argument("--keep-state", action="store_true")
    for p in (u, la, d):
        p.add_argument("--state", default=str(DEFAULT_STATE), help="state dir (default %(default)s)")
    a = ap.parse_args(argv)
    if a.cmd == "up":
        st = up(a.state, a.home, a.webserver_port)
        print(env_sh(st), end="")
        print(f"# image {st['image']} ({'built' if st['image_built'] else 'cached'}); containers "
              f"{', '.join(st['containers'].values())}; up in {st['timings']['up_s']} s")
        if st.get("webserver_url"):
            print(f"# Dagster UI: {st['webserver_url']}")
        print(f"# env file: {a.state}/env.sh   teardown: python -m deploy down --state {a.state}")
        return 0
    if a.cmd == "launch":
        st = load_state(a.state)
        run_id = launch(st, a.job, json.loads(a.config_json) if a.config_json else None)
        print(f"run {run_id} queued")
        status = wait_run(st, run_id)
        print(f"run {run_id}: {status}")
        return 0 if status == "SUCCESS" else 1
    for line in down(a.state, remove_state=not a.keep_state):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

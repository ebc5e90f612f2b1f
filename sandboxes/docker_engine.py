"""Get a Docker engine and the sandbox base image on a bare Debian machine, offline.

    python -m sandboxes.docker_engine --ensure     # what `make test` runs; always exits 0
    python -m sandboxes.docker_engine --stop       # stop a dockerd that this module started

`ensure()` returns `(reason, info)`: `reason` is None when an engine answers and the base image
exists, otherwise one sentence saying exactly what is missing (the Docker tests skip with it).
Steps, each skipped when already done:

1. an engine answers (`DOCKER_HOST`, else /var/run/docker.sock): use it;
2. otherwise, as root, start `dockerd --bridge=none --iptables=false --ip-masq=false` in the
   background (its own data root, pid file and log under the cache dir; no bridge network, no
   iptables: containers only ever use `network_mode="none"`) and wait until it answers;
3. build `ratchet-sandbox-base:<tag>` once, without any registry:
   `debootstrap --variant=minbase --include=python3,python3-pytest,python-is-python3,git bookworm ROOT MIRROR`
   (MIRROR from the host's apt sources), then `tar -C ROOT -c . | docker import -`.

The cache dir is `$RATCHET_DOCKER_CACHE`, else `$XDG_CACHE_HOME/ratchet/docker`, else
`~/.cache/ratchet/docker` (the data root keeps the image across runs and checkouts). Needs the
Debian packages `docker.io` and `debootstrap` (`make sysdeps`).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

BASE_REPO = "ratchet-sandbox-base"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-pytest", "python-is-python3", "git")
SANDBOX_UID = 10001                 # the unprivileged user the sandbox runs as ("sandbox")
_RECIPE = f"v1 minbase {SUITE} {','.join(PACKAGES)} uid={SANDBOX_UID}"
BASE_TAG = f"{SUITE}-" + hashlib.sha256(_RECIPE.encode()).hexdigest()[:12]
BASE_IMAGE = f"{BASE_REPO}:{BASE_TAG}"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
LABEL = "ratchet.sandbox"           # every container the runtime creates carries this label


def cache_dir() -> Path:
    if os.environ.get("RATCHET_DOCKER_CACHE"):
        return Path(os.environ["RATCHET_DOCKER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ratchet" / "docker"


def docker_cli() -> str | None:
    return shutil.which("docker")


def _socket_path() -> str | None:
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return "/var/run/docker.sock"
    return host[len("unix://"):] if host.startswith("unix://") else None


def client(timeout: float = 60):
    """A docker SDK client for the engine (raises when the SDK is missing or nothing answers)."""
    import docker
    c = docker.from_env(timeout=timeout)
    c.ping()
    return c


def engine_reason(timeout: float = 5) -> str | None:
    """None when an engine answers, else why not."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker SDK is not installed (pip install 'docker>=7')"
    try:
        client(timeout).close()
        return None
    except Exception as e:  # noqa: BLE001 - any failure to reach the engine
        msg = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        return f"no Docker engine answers at {os.environ.get('DOCKER_HOST') or 'unix:///var/run/docker.sock'}: {msg}"


@contextmanager
def _locked(name: str):
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def start_engine(wait_s: float = 30.0) -> str | None:
    """Start dockerd in the background when nothing answers (root only). None when it answers."""
    if engine_reason() is None:
        return None
    with _locked("engine.lock"):
        first = engine_reason()
        if first is None:
            return None
        if os.geteuid() != 0:
            return f"{first}; not root, so dockerd cannot be started here (start it as root: make test as root)"
        dockerd = shutil.which("dockerd") or next(
            (p for p in ("/usr/sbin/dockerd", "/usr/bin/dockerd") if os.access(p, os.X_OK)), None)
        if not dockerd:
            return f"{first}; dockerd is not installed (apt-get install docker.io: make sysdeps)"
        sock = _socket_path()
        if sock is None:
            return f"{first}; DOCKER_HOST is not a unix socket, so dockerd is not started here"
        d = cache_dir()
        (d / "data").mkdir(parents=True, exist_ok=True)
        log_path = d / "dockerd.log"
        pidfile = d / "dockerd.pid"
        _stop_stale(pidfile)
        cmd = [dockerd, "--bridge=none", "--iptables=false", "--ip-masq=false",
               f"--data-root={d / 'data'}", f"--pidfile={pidfile}",
               "-H", f"unix://{sock}"]
        log = open(log_path, "ab")
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, close_fds=True)
        except OSError as e:
            return f"{first}; starting dockerd failed: {e}"
        finally:
            log.close()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if engine_reason(timeout=2) is None:
                return None
            if proc.poll() is not None:
                return f"dockerd exited with status {proc.returncode}: {_tail(log_path)}"
            time.sleep(0.2)
        return f"dockerd started (pid {proc.pid}) but did not answer within {wait_s:.0f} s: {_tail(log_path)}"


def _stop_stale(pidfile: Path) -> None:
    """dockerd refuses to start while its pid file names a live process; drop a dead one."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pidfile.unlink(missing_ok=True)
    except PermissionError:
        pass


def stop_engine(timeout: float = 20.0) -> str:
    """Stop the dockerd this module started (from its pid file)."""
    pidfile = cache_dir() / "dockerd.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return "no dockerd started by ratchet (no pid file)"
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        pidfile.unlink(missing_ok=True)
        return f"dockerd {pid} was not running"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"stopped dockerd {pid}"
        if Path(f"/proc/{pid}/stat").exists() and " Z " in Path(f"/proc/{pid}/stat").read_text():
            return f"stopped dockerd {pid}"
        time.sleep(0.2)
    return f"dockerd {pid} still running after {timeout:.0f} s"


def _tail(path: Path, n: int = 600) -> str:
    """The last error lines of a log (or its last line)."""
    try:
        lines = path.read_bytes()[-8000:].decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return "(no log)"
    errs = [ln for ln in lines if re.search(r"level=(error|fatal)|failed|E: ", ln)]
    return (" | ".join(errs[-3:]) or (lines[-1] if lines else "(empty log)"))[-n:]


def apt_mirror() -> str:
    """The Debian mirror the host's apt uses (deb822 sources first, then sources.list)."""
    deb822 = Path("/etc/apt/sources.list.d/debian.sources")
    if deb822.exists():
        for stanza in re.split(r"\n\s*\n", deb822.read_text()):
            fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
            suites = fields.get("Suites", "").split()
            if "deb" in fields.get("Types", "deb").split() and fields.get("URIs") and \
                    not all(s.endswith("-security") for s in suites):
                return fields["URIs"].split()[0]
    for f in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            m = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m and not m.group(2).endswith("-security"):
                return m.group(1)
    return DEFAULT_MIRROR


def image_exists(name: str = BASE_IMAGE) -> bool:
    try:
        c = client(10)
    except Exception:  # noqa: BLE001
        return False
    try:
        c.images.get(name)
        return True
    except Exception:  # noqa: BLE001 - ImageNotFound or an API error
        return False
    finally:
        c.close()


def build_base_image(force: bool = False) -> str | None:
    """Build BASE_IMAGE with debootstrap + docker import (root only). None when it exists."""
    if not force and image_exists():
        return None
    with _locked("image.lock"):
        if not force and image_exists():
            return None
        if os.geteuid() != 0:
            return f"image {BASE_IMAGE} is missing and building it needs root (debootstrap)"
        deboot = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if os.access("/usr/sbin/debootstrap", os.X_OK) else None)
        if not deboot:
            return f"image {BASE_IMAGE} is missing and debootstrap is not installed (apt-get install debootstrap: make sysdeps)"
        cli = docker_cli()
        if not cli:
            return f"image {BASE_IMAGE} is missing and the docker CLI is not installed (apt-get install docker.io)"
        mirror = apt_mirror()
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=d))
        log_path = d / "debootstrap.log"
        try:
            with open(log_path, "wb") as log:
                r = subprocess.run([deboot, "--variant=minbase", f"--include={','.join(PACKAGES)}",
                                    SUITE, str(root), mirror], stdout=log, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                return (f"debootstrap {SUITE} from {mirror} failed (exit {r.returncode}; log "
                        f"{log_path}): {_tail(log_path)}")
            _add_sandbox_user(root)
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (root / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."],
                                   stdout=subprocess.PIPE)
            imp = subprocess.run([cli, "import", "-c", "ENV LANG=C.UTF-8", "-c",
                                  f"LABEL {LABEL}.base={_RECIPE.replace(' ', '_')}",
                                  "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True)
            tar.stdout.close()
            tar.wait()
            if imp.returncode != 0 or tar.returncode != 0:
                return (f"docker import of {BASE_IMAGE} failed (tar {tar.returncode}, import "
                        f"{imp.returncode}): {imp.stderr.decode(errors='replace').strip()[:400]}")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if not image_exists():
        return f"image {BASE_IMAGE} still missing after the build"
    _prune_old_base_images()
    return None


def _prune_old_base_images() -> None:
    """Drop base images of earlier recipes (other tags of BASE_REPO); best effort."""
    try:
        c = client(30)
        for img in c.images.list(name=BASE_REPO):
            if BASE_IMAGE not in img.tags:
                try:
                    c.images.remove(img.id)
                except Exception:  # noqa: BLE001 - still used by a container: keep it
                    pass
        c.close()
    except Exception:  # noqa: BLE001
        pass


def _add_sandbox_user(root: Path) -> None:
    u = SANDBOX_UID
    with open(root / "etc" / "passwd", "a") as f:
        f.write(f"sandbox:x:{u}:{u}:ratchet sandbox:/tmp:/usr/sbin/nologin\n")
    with open(root / "etc" / "group", "a") as f:
        f.write(f"sandbox:x:{u}:\n")


def limits_reason(c) -> str | None:
    """None when the engine enforces the limits the sandbox relies on, else which it cannot.
    (Without the memory or pids cgroup, dockerd only warns and runs the container unlimited.)"""
    try:
        info = c.info()
    except Exception as e:  # noqa: BLE001
        return f"docker info failed: {e}"
    missing = [k for k in ("MemoryLimit", "PidsLimit", "CpuCfsQuota") if not info.get(k)]
    if missing:
        return f"the Docker engine cannot enforce {', '.join(missing)} (cgroup controllers missing)"
    return None


def smoke_reason() -> str | None:
    """None when a locked-down container (as the runtime makes them) starts and runs Python."""
    try:
        c = client(60)
    except Exception as e:  # noqa: BLE001
        return f"no Docker engine answers: {e}"
    try:
        why = limits_reason(c)
        if why:
            return why
        out = c.containers.run(
            BASE_IMAGE, ["python3", "-c", "import os; print(os.getuid())"], remove=True,
            network_mode="none", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"],
            user=f"{SANDBOX_UID}:{SANDBOX_UID}", pids_limit=64, mem_limit="256m", nano_cpus=10**9,
            tmpfs={"/tmp": "size=16m"}, labels={LABEL: "1", "ratchet.episode": "smoke"})
        if out.decode().strip() != str(SANDBOX_UID):
            return f"the smoke container printed {out[:200]!r}"
        return None
    except Exception as e:  # noqa: BLE001
        return f"a locked-down container does not run here: {str(e)[:400]}"
    finally:
        c.close()


def ensure(build_image: bool = True) -> tuple[str | None, dict]:
    """Engine up and base image built; returns (reason or None, timings)."""
    info: dict = {"image": BASE_IMAGE}
    t0 = time.monotonic()
    answered = engine_reason() is None
    reason = None if answered else start_engine()
    info["engine"] = "already running" if answered else ("started" if reason is None else "unavailable")
    info["engine_s"] = round(time.monotonic() - t0, 2)
    if reason:
        return reason, info
    if build_image:
        t1 = time.monotonic()
        existed = image_exists()
        reason = None if existed else build_base_image()
        info["image_state"] = "cached" if existed else ("built" if reason is None else "unavailable")
        info["image_s"] = round(time.monotonic() - t1, 2)
        if reason is None:
            t2 = time.monotonic()
            reason = smoke_reason()
            info["smoke_s"] = round(time.monotonic() - t2, 2)
    return reason, info


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m sandboxes.docker_engine", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--ensure", action="store_true", help="start the engine and build the base image if needed")
    g.add_argument("--status", action="store_true", help="say whether the engine answers and the image exists")
    g.add_argument("--stop", action="store_true", help="stop a dockerd started by this module")
    ap.add_argument("--strict", action="store_true", help="exit 1 when Docker is unavailable")
    a = ap.parse_args(argv)
    if a.stop:
        print(stop_engine())
        return 0
    if a.status:
        reason = engine_reason() or (None if image_exists() else f"image {BASE_IMAGE} is not built")
        print(f"docker: {'ready' if reason is None else 'unavailable: ' + reason} (image {BASE_IMAGE})")
        return 1 if reason and a.strict else 0
    reason, info = ensure()
    if reason is None:
        print(f"docker: ready (engine {info['engine']} in {info['engine_s']} s; image {BASE_IMAGE} "
              f"{info.get('image_state')} in {info.get('image_s')} s; a sandbox container ran in "
              f"{info.get('smoke_s')} s)")
        return 0
    print(f"docker: unavailable, the Docker sandbox tests will skip: {reason}", file=sys.stderr)
    return 1 if a.strict else 0


if __name__ == "__main__":
    sys.exit(main())

"""A Docker daemon and the project's image, for tests/test_docker.py.

The daemon: the one ``DOCKER_HOST`` names, else the one at /var/run/docker.sock, else (as
root, with Debian's docker.io installed) one started here, with no bridge and no
iptables rules (every container then uses the host's network, so no traffic leaves
loopback), its own socket and pid file, stopped by its pid at the end. Its images live
in ``PIPELINE_DOCKER_CACHE`` (default ~/.cache/listings-pipeline/docker), so a rerun
finds the base image and the build's layers there.

The base image has no registry to come from: it is Debian 12 with Python 3.11 built by
debootstrap from Debian's packages and imported, tagged by a key of the recipe, so it
is built once per recipe. The project's image is ``deploy/Dockerfile`` on that base,
installed from a wheelhouse downloaded on this machine for the base's Python (the
image's own build then needs no package index).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PIPELINE_DOCKER_CACHE") or Path.home() / ".cache" / "listings-pipeline" / "docker")
BASE_RECIPE = {
    "suite": "bookworm", "variant": "minbase", "include": "python3,python3-venv,ca-certificates",
    "mirror": "http://deb.debian.org/debian",
}
IMAGE = "listings-pipeline:test"
WHEELS = ROOT / ".docker-wheels"  # in the build context; .gitignore'd
# Dependencies with no wheel on the package index, only a source archive of pure Python:
# extruct's jstyleson (pipeline/fetching/structured.py).
SOURCE_ONLY = ("jstyleson==0.0.2",)


class NoDocker(Exception):
    """No Docker daemon could be reached or started here (the message says why)."""


@dataclass
class Docker:
    """The docker CLI pointed at one daemon; ``pid`` is set when this module started it."""

    host: str
    pid: int | None = None
    exec_root: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def __call__(self, *args: str, check: bool = True, timeout: float = 600,
                 input: bytes | None = None) -> str:
        done = subprocess.run(["docker", *args], env=self.env, capture_output=True, timeout=timeout,
                              check=False, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed ({done.returncode}): "
                                 f"{done.stderr.decode(errors='replace')[-3000:]}")
        return done.stdout.decode(errors="replace")

    def answers(self) -> bool:
        done = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], env=self.env,
                              capture_output=True, timeout=30, check=False)
        return done.returncode == 0

    def running(self) -> list[str]:
        return self("ps", "-q").split()

    def stop(self) -> None:
        """Stop the daemon this module started (by its pid), and wait until it is gone."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        wait_until("dockerd to exit", lambda: not _alive(self.pid), 60, every=0.2)
        if self.exec_root is not None:
            # dockerd leaves its default network namespace mounted under its exec root.
            for mount in _mounts_under(self.exec_root):
                subprocess.run(["umount", mount], check=False, capture_output=True)
            shutil.rmtree(self.exec_root, ignore_errors=True)


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (/proc/self/mountinfo's 5th field)."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if p == str(path) or p.startswith(f"{path}/")), reverse=True)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (our child, exited, not yet reaped) is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def connect() -> Docker:
    """A daemon to use; NoDocker saying why when there is none and none can be started."""
    if shutil.which("docker") is None:
        raise NoDocker("no docker CLI on PATH (Debian: apt-get install docker.io)")
    if os.environ.get("DOCKER_HOST"):
        docker = Docker(os.environ["DOCKER_HOST"])
        if docker.answers():
            return docker
        raise NoDocker(f"DOCKER_HOST={docker.host} does not answer")
    default = Docker("unix:///var/run/docker.sock")
    if Path("/var/run/docker.sock").exists() and default.answers():
        return default
    return start_daemon()


def start_daemon() -> Docker:
    if shutil.which("dockerd") is None:
        raise NoDocker("no Docker daemon answers and dockerd is not installed (Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        raise NoDocker("no Docker daemon answers, and starting dockerd needs root")
    exec_root = Path(tempfile.mkdtemp(prefix="pl-docker-"))  # short: it holds Unix sockets
    data_root = CACHE / "data"
    data_root.mkdir(parents=True, exist_ok=True)
    socket = exec_root / "docker.sock"
    log = (exec_root / "dockerd.log").open("wb")
    daemon = subprocess.Popen(
        ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false",
         "--data-root", str(data_root), "--exec-root", str(exec_root / "exec"),
         "--pidfile", str(exec_root / "docker.pid"), "-H", f"unix://{socket}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    docker = Docker(f"unix://{socket}", pid=daemon.pid, exec_root=exec_root)

    def ready() -> bool:
        if daemon.poll() is not None:
            raise NoDocker(f"dockerd exited ({daemon.returncode}): "
                           f"{(exec_root / 'dockerd.log').read_text(errors='replace')[-2000:]}")
        return socket.exists() and docker.answers()

    try:
        wait_until("dockerd to answer", ready, 120, every=0.2)
    except AssertionError as e:
        daemon.kill()
        raise NoDocker(str(e)) from None
    return docker


def _key(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def base_image(docker: Docker) -> tuple[str, float]:
    """The base image's tag, and the seconds it took (about 0 when it was there)."""
    tag = f"listings-pipeline-base:{_key(BASE_RECIPE)}"
    started = time.monotonic()
    if docker("image", "inspect", tag, check=False).strip() not in ("", "[]"):
        return tag, time.monotonic() - started
    if shutil.which("debootstrap") is None:
        raise NoDocker("the base image is built with debootstrap, which is not installed "
                       "(Debian: apt-get install debootstrap)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as rootfs:
        subprocess.run(
            ["debootstrap", f"--variant={BASE_RECIPE['variant']}", f"--include={BASE_RECIPE['include']}",
             BASE_RECIPE["suite"], rootfs, BASE_RECIPE["mirror"]],
            check=True, capture_output=True, timeout=1200,
        )
        tar = subprocess.run(["tar", "-C", rootfs, "-c", "."], check=True, capture_output=True)
        docker("import", "-", tag, input=tar.stdout)
    return tag, time.monotonic() - started


def wheelhouse(docker: Docker, base: str) -> None:
    """Wheels of every dependency for the base's Python, in .docker-wheels/ (the build
    context); downloaded once per pyproject.toml and Python version."""
    python = docker("run", "--rm", "--network", "host", base, "python3", "-c",
                    "import platform; print(platform.python_version())").strip()
    cached = CACHE / f"wheels-{_key([(ROOT / 'pyproject.toml').read_text(), python])}"
    if not cached.exists():
        partial = Path(tempfile.mkdtemp(dir=CACHE, prefix="wheels-"))
        # Dependencies published as source only (pure Python), built into wheels here, where
        # the binary-only download below finds them (--find-links).
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--wheel-dir", str(partial), *SOURCE_ONLY],
            check=True, capture_output=True, timeout=900,
        )
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--dest", str(partial), "--find-links", str(partial), "--python-version", python,
             "--only-binary=:all:", "setuptools>=68", "wheel", f"{ROOT}[docker]"],
            check=True, capture_output=True, timeout=900,
        )
        for own in partial.glob("listings_pipeline*"):
            own.unlink()  # the project itself is installed from the build context
        partial.rename(cached)
    shutil.rmtree(WHEELS, ignore_errors=True)
    shutil.copytree(cached, WHEELS)


def build_image(docker: Docker, base: str) -> float:
    """Build deploy/Dockerfile on ``base`` as IMAGE; the seconds it took."""
    started = time.monotonic()
    docker("build", "--quiet", "--network", "host", "-f", str(ROOT / "deploy" / "Dockerfile"),
           "--build-arg", f"BASE_IMAGE={base}",
           "--build-arg", "PIP_OPTIONS=--no-index --find-links /src/.docker-wheels",
           "-t", IMAGE, str(ROOT), timeout=1200)
    # The image an earlier build tagged is dangling now: drop it, so the cache holds the
    # base and one image, not one per code change.
    docker("image", "prune", "--force")
    return time.monotonic() - started


# The images of the Compose file's other services, as their official images are laid out
# (prom/prometheus: /bin/prometheus its entrypoint; caddy: caddy on PATH), made of this
# machine's Debian binaries on the base image, there being no registry to pull from.
PROMETHEUS_IMAGE = "listings-pipeline-prometheus:test"
CADDY_IMAGE = "listings-pipeline-caddy:test"
ALERTMANAGER_IMAGE = "listings-pipeline-alertmanager:test"


def prometheus_image(docker: Docker, base: str) -> str:
    return _binaries_image(docker, base, PROMETHEUS_IMAGE, "prometheus", ["prometheus", "promtool"],
                           'RUN mkdir -p /prometheus\nENTRYPOINT ["/bin/prometheus"]\n')


def alertmanager_image(docker: Docker, base: str) -> str:
    # Debian's binary reads its default notification templates from its package's folder.
    return _binaries_image(docker, base, ALERTMANAGER_IMAGE, "prometheus-alertmanager", ["prometheus-alertmanager"],
                           'RUN mkdir -p /alertmanager\nENTRYPOINT ["/bin/prometheus-alertmanager"]\n',
                           folders=["/usr/share/prometheus/alertmanager"])


def caddy_image(docker: Docker, base: str) -> str:
    return _binaries_image(docker, base, CADDY_IMAGE, "caddy", ["caddy"], "")


def _binaries_image(docker: Docker, base: str, tag: str, package: str, binaries: list[str], tail: str,
                    *, folders: list[str] | None = None) -> str:
    """``tag``: ``base`` with this machine's ``binaries`` (of Debian's ``package``, which
    CI installs) in /bin, and its ``folders`` where they are here."""
    found = [shutil.which(name) for name in binaries]
    if None in found or not all(Path(folder).is_dir() for folder in folders or []):
        raise NoDocker(f"the image {tag} is built from this machine's {', '.join(binaries)}, which are "
                       f"not installed (Debian: apt-get install {package})")
    with tempfile.TemporaryDirectory() as context:
        for binary in found:
            shutil.copy(str(binary), context)
        copies = ""
        for n, folder in enumerate(folders or []):
            shutil.copytree(folder, Path(context, f"folder{n}"), ignore_dangling_symlinks=True)
            copies += f"COPY folder{n} {folder}\n"
        Path(context, "Dockerfile").write_text(f"FROM {base}\nCOPY {' '.join(binaries)} /bin/\n{copies}{tail}")
        docker("build", "--quiet", "--network", "host", "-t", tag, context, timeout=600)
    return tag


def compose_command() -> list[str]:
    """``docker-compose`` (Compose v1, Debian's docker-compose) or ``docker compose`` (v2)."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    raise NoDocker("neither docker-compose nor the docker compose plugin is installed "
                   "(Debian: apt-get install docker-compose)")


class ComposeStack:
    """deploy/docker-compose.yaml's services, up under a project name of their own
    (``prefix`` and this process's id): compose's output goes to ``log``, each compose
    command may take ``timeout`` seconds. tests/test_docker.py's stack and the hour's
    (bench/soak_stack.py)."""

    def __init__(self, docker: Docker, env: dict[str, str], log: Path, *, prefix: str, timeout: float) -> None:
        self.docker, self.log, self.timeout = docker, log, timeout
        self.env = {**docker.env, **env}
        self.project = f"{prefix}{os.getpid()}"

    def command(self, *args: str) -> list[str]:
        """``docker compose ARGS`` for this stack (its project name and file)."""
        return [*compose_command(), "-p", self.project, "-f", str(ROOT / "deploy" / "docker-compose.yaml"), *args]

    def compose(self, *args: str) -> None:
        with self.log.open("ab") as log:
            subprocess.run(self.command(*args), env=self.env, stdout=log, stderr=subprocess.STDOUT, check=True,
                           timeout=self.timeout)

    def keep_logs(self, folder: Path, *, timeout: float, each: float) -> None:
        """The services' logs (read within ``timeout`` seconds) and every run container's,
        running or exited (``each`` seconds each), into ``folder``: what a run did at a
        moment the caller cannot explain."""
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "services.log").open("wb") as log:
            subprocess.run(self.command("logs", "--no-color", "-t"), env=self.env, stdout=log,
                           stderr=subprocess.STDOUT, check=False, timeout=timeout)
        for container in self.docker("ps", "-aq", "--filter", "label=dagster/run_id").split():
            with (folder / f"run-{container}.log").open("wb") as log:
                subprocess.run(["docker", "logs", "-t", container], env=self.env, stdout=log,
                               stderr=subprocess.STDOUT, check=False, timeout=each)

"""The Docker files agree with the rest of the deployment (no daemon needed; the stack
itself runs in tests/test_docker.py): the image's instance is deploy/dagster.yaml with
Docker's run launcher and nothing else changed, and every setting the compose file and
the run launcher pass on is one the pipeline reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from pipeline.core import secret_files
from pipeline.core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def settings_names() -> set[str]:
    """Every environment variable the pipeline's settings read: recorded by reading them
    (``Settings.from_env``), so a setting added there is a setting the deployment must pass."""
    read: list[str] = []

    class Recording(dict):
        def get(self, name, default=None):
            read.append(name)
            # DATABASE_URL is set, as the deployment requires (else the embedded
            # default's PIPELINE_STATE_DIR would be read too).
            return "postgresql://pipeline@127.0.0.1/pipeline" if name == "DATABASE_URL" else default

    saved = os.environ
    os.environ = Recording()  # type: ignore[assignment]
    try:
        Settings.from_env()
    finally:
        os.environ = saved
    return set(read)


def test_the_image_instance_is_the_production_instance_with_the_docker_run_launcher():
    production, image = load(DEPLOY / "dagster.yaml"), load(DEPLOY / "docker" / "dagster.yaml")
    assert image["run_launcher"]["class"] == "DockerRunLauncher"
    assert {k: v for k, v in image.items() if k != "run_launcher"} == \
        {k: v for k, v in production.items() if k != "run_launcher"}


def test_the_settings_passed_to_services_and_run_containers_are_the_pipelines():
    compose = load(DEPLOY / "docker-compose.yaml")
    environment = compose["x-pipeline-environment"]
    launcher = load(DEPLOY / "docker" / "dagster.yaml")["run_launcher"]["config"]
    plain = settings_names() - set(secret_files.SECRETS)
    passed = {n for n in environment if n.startswith("PIPELINE_")} - {
        "PIPELINE_CODE_LOCATION_HOST", "PIPELINE_CODE_LOCATION_PORT",  # the workspace's, not settings
        secret_files.FOLDER_SETTING}
    # Every setting reaches the services and every run container, and nothing else does
    # (the retention, backfill and adaptive-cadence settings once reached neither); the
    # secrets reach them as files.
    assert passed == plain, f"not passed: {sorted(plain - passed)}; not settings: {sorted(passed - plain)}"
    assert set(launcher["env_vars"]) == plain | {secret_files.FOLDER_SETTING}, (
        f"not passed to runs: {sorted(plain - set(launcher['env_vars']))}")
    # A run container gets what the daemon has: each name the launcher passes must be set there.
    assert set(launcher["env_vars"]) <= set(environment)
    for name, service in compose["services"].items():
        assert service["network_mode"] == "host"
        if name not in ("prometheus", "alertmanager", "proxy"):
            assert service["image"] == "${PIPELINE_IMAGE:-listings-pipeline:latest}"
    assert launcher["container_kwargs"]["network_mode"] == "host"


def test_no_secret_is_in_a_containers_environment_each_reads_them_from_the_mounted_folder():
    """DATABASE_URL and DAGSTER_POSTGRES_URL (with their passwords) and the operator alert
    channel were plain environment: in every service's and every run container's
    `docker inspect`. Now each container of the image, run containers too, mounts the
    secrets' folder where PIPELINE_SECRETS_DIR says, and its entrypoint reads them."""
    compose = load(DEPLOY / "docker-compose.yaml")
    launcher = load(DEPLOY / "docker" / "dagster.yaml")["run_launcher"]["config"]
    mount = f"{secret_files.MOUNT}:ro"
    assert compose["x-pipeline-environment"][secret_files.FOLDER_SETTING] == secret_files.MOUNT
    for name, service in compose["services"].items():
        assert not set(secret_files.SECRETS) & set(service.get("environment") or {}), name
        if service["image"].startswith("${PIPELINE_IMAGE"):
            [volume] = [v for v in service["volumes"] if v.endswith(mount)]
            assert volume.startswith("${PIPELINE_SECRETS_DIR:?"), (name, volume)
    assert not set(secret_files.SECRETS) & set(launcher["env_vars"])
    command = compose["services"]["code"]["command"]
    context = json.loads(command[command.index("--container-context") + 1])
    assert context["docker"]["container_kwargs"]["volumes"] == ["${PIPELINE_SECRETS_DIR}" + ":" + mount]
    # A healthcheck does not pass through the entrypoint: the one reading Dagster's storage says so.
    assert compose["services"]["daemon"]["healthcheck"]["test"][1:5] == [
        "python", "-m", "pipeline.core.secret_files", "dagster-daemon"]
    assert 'ENTRYPOINT ["python", "-m", "pipeline.core.secret_files"]' in (DEPLOY / "Dockerfile").read_text()


def test_every_service_listens_on_loopback_has_a_healthcheck_and_waits_for_what_it_needs():
    """The webserver listened on 0.0.0.0 with host networking and no login: the UI was
    open to the network. Every service now listens on 127.0.0.1 (a reverse proxy or a
    tunnel reaches the UI), reports its health, and starts once what it needs is healthy."""
    services = load(DEPLOY / "docker-compose.yaml")["services"]
    for name, service in services.items():
        command = " ".join(service["command"]) if isinstance(service["command"], list) else service["command"]
        assert "0.0.0.0" not in command, name
        if name not in ("daemon", "proxy"):  # the others listen, on loopback
            assert "127.0.0.1" in command, name
        assert service["healthcheck"]["test"], name
        for needed in service.get("depends_on", {}):
            assert service["depends_on"][needed] == {"condition": "service_healthy"}, (name, needed)
    assert set(services["webserver"]["depends_on"]) == set(services["daemon"]["depends_on"]) == {"code"}
    assert set(services["prometheus"]["depends_on"]) == {"metrics"}
    # Alertmanager: no cluster port (it would listen on every address), the web service first.
    assert "--cluster.listen-address=" in services["alertmanager"]["command"]
    assert set(services["alertmanager"]["depends_on"]) == {"web"}
    # The proxy is the one door from the network: it listens where its site says, and
    # only with a login (its password hash is required) and TLS.
    assert set(services["proxy"]["depends_on"]) == {"webserver", "web"}
    assert ":?" in services["proxy"]["environment"]["PIPELINE_PROXY_PASSWORD_HASH"]
    caddyfile = (DEPLOY / "proxy" / "Caddyfile").read_text()
    assert "basicauth" in caddyfile and "tls {$PIPELINE_PROXY_TLS:internal}" in caddyfile
    # Only the output feeds and the WebSub callback pass without the login (tests/test_docker.py tries the feeds).
    assert "handle /feeds/* {\n\t\treverse_proxy 127.0.0.1:{$PIPELINE_WEB_PORT:8790}\n\t}" in caddyfile
    assert "handle /websub/* {\n\t\treverse_proxy 127.0.0.1:{$PIPELINE_WEB_PORT:8790}\n\t}" in caddyfile


def test_the_dockerfile_builds_on_the_usual_python_image_by_default():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile
    assert 'pip install' in dockerfile and '"/src[docker]"' in dockerfile
    assert "COPY deploy/docker/dagster.yaml /opt/dagster/home/dagster.yaml" in dockerfile

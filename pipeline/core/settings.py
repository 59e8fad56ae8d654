"""Settings from the environment, with their defaults (README, "Configuration").

Every setting is an environment variable; the Dagster resources expose the same names as
fields and fall back to these values when a field is left unset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.core.cadence import MAX_INTERVAL_MINUTES, MIN_INTERVAL_MINUTES
from pipeline.core.errors import ConfigError

# A claim's lease: how long a dead worker's rows wait before another worker takes them.
# Live work keeps its lease (the heartbeat extends it every third of a lease and tries
# again within seconds when an extension fails), so this is what a killed run costs, not
# a limit on how long work may take (bench/RESULTS.md: 300 s held a killed run's
# notifications for five minutes).
DEFAULT_LEASE_SECONDS = 60
DEFAULT_HTTP_TIMEOUT_SECONDS = 20.0
DEFAULT_MAX_RESPONSE_BYTES = 15 * 1024 * 1024
DEFAULT_CONCURRENCY = 16
DEFAULT_RAW_MAX_ATTEMPTS = 3
DEFAULT_SOURCE_MAX_ATTEMPTS = 3
# New or changed items stored from one fetch; the rest wait for the next fetch (15 MB of
# tiny items would otherwise be half a million raw rows at once).
DEFAULT_MAX_ITEMS_PER_FETCH = 5000
DEFAULT_DELIVERY_MAX_ATTEMPTS = 8
DEFAULT_RAW_RETENTION_DAYS = 30
DEFAULT_EVENT_RETENTION_DAYS = 90
DEFAULT_DEMO_PORT = 8780
DEFAULT_WEB_PORT = 8790
# The Dagster layer's: how often a stage sensor looks, runs of a stage at once, the asset
# checks' thresholds, and the first day of the backfill jobs' partitions.
DEFAULT_SENSOR_INTERVAL_SECONDS = 30
MIN_SENSOR_INTERVAL_SECONDS = 5
DEFAULT_MAX_RUNS = 2
STAGES = ("collector", "processor", "notifier")
DEFAULT_STALE_LEASE_MINUTES = 10
DEFAULT_FRESHNESS_MAX_MINUTES = 60
DEFAULT_LATENESS_MAX_MINUTES = 15
DEFAULT_INGEST_LINGER_SECONDS = 300
DEFAULT_UI_URL = "http://127.0.0.1:3000"
DEFAULT_RUN_RETENTION_DAYS = 14  # Dagster runs (and their event logs) kept this long
# Adaptive cadence (pipeline/core/cadence.py): a source's bounds when it sets none.
DEFAULT_ADAPTIVE_MIN_MINUTES = 15
DEFAULT_ADAPTIVE_MAX_MINUTES = 1440
# A user hears at most this many alerts one by one in a window; the rest of the window's
# go out as one summary delivery at its end (and a listing's change alerts at most once
# a window): pipeline/notify/notifier.py, docs/runbook.md "Limits".
DEFAULT_ALERT_LIMIT = 20
DEFAULT_ALERT_WINDOW_MINUTES = 10
DEFAULT_WEBSUB_SAFETY_HOURS = 6  # a pushed source's polling interval, at least
DEFAULT_WEBSUB_PUSHES_PER_MINUTE = 60  # a subscription's pushes taken, more answered 429
DEFAULT_OWNER_ALERT_FAILURES = 3  # failed fetches in a row before a source's owner is told


def project_root() -> Path:
    """The checkout this package runs from, or the working directory for a plain install.

    An editable install (the README's commands) imports ``pipeline`` from the checkout,
    so the state folder lands beside ``pyproject.toml`` wherever the command is run from.
    """
    here = Path(__file__).resolve().parents[2]
    if (here / "pyproject.toml").exists():
        return here
    return Path.cwd()


def state_dir() -> Path:
    """The project-local, git-ignored folder for the embedded database and DAGSTER_HOME."""
    configured = os.environ.get("PIPELINE_STATE_DIR")
    return Path(configured) if configured else project_root() / ".state"


def demo_port() -> int:
    """The offline demo site's port on 127.0.0.1 (PIPELINE_DEMO_PORT, default 8780)."""
    return _int_env("PIPELINE_DEMO_PORT", DEFAULT_DEMO_PORT)


def web_port() -> int:
    """The port `pipeline serve` (the output feeds) listens on (PIPELINE_WEB_PORT, default 8790)."""
    return _int_env("PIPELINE_WEB_PORT", DEFAULT_WEB_PORT)


def default_database_url() -> str:
    return f"sqlite:///{state_dir() / 'pipeline.db'}"


def _int_env(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


def _choice_env(name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first when unset)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return choices[0]
    if raw not in choices:
        raise ConfigError(f"{name}={raw!r}: use one of {', '.join(choices)}")
    return raw


def _url_env(name: str) -> str | None:
    """An http(s) base URL, without a trailing slash; None when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"{name}={raw!r} is not an http(s) base URL such as https://feeds.example.org")
    return raw.rstrip("/")


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ConfigError(f"{name}={value} must be positive")
    return value


@dataclass(frozen=True)
class Settings:
    database_url: str
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    http_timeout_seconds: float = DEFAULT_HTTP_TIMEOUT_SECONDS
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_items_per_fetch: int = DEFAULT_MAX_ITEMS_PER_FETCH
    concurrency: int = DEFAULT_CONCURRENCY
    allow_networks: tuple[str, ...] = ()
    raw_max_attempts: int = DEFAULT_RAW_MAX_ATTEMPTS  # a raw row that fails this often is given up
    # a source claimed this often without a fetch finishing (each holder died) fails
    source_max_attempts: int = DEFAULT_SOURCE_MAX_ATTEMPTS
    delivery_max_attempts: int = DEFAULT_DELIVERY_MAX_ATTEMPTS  # then a notification is dead
    # how a source's politeness group is named when none is given: "host" or "domain"
    politeness_group_by: str = "host"
    raw_retention_days: int = DEFAULT_RAW_RETENTION_DAYS  # processed raw rows kept this long
    event_retention_days: int = DEFAULT_EVENT_RETENTION_DAYS  # ingestion_events kept this long
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL_SECONDS
    # an ingest run the sensor starts keeps taking sources as they come due this long
    ingest_linger_seconds: int = DEFAULT_INGEST_LINGER_SECONDS
    # runs of each stage its sensor lets be active at once, in the order of STAGES
    stage_max_runs: tuple[int, ...] = (DEFAULT_MAX_RUNS,) * len(STAGES)
    stale_lease_minutes: int = DEFAULT_STALE_LEASE_MINUTES
    # the freshness checks warn when a stage's oldest waiting work has waited longer
    freshness_max_minutes: int = DEFAULT_FRESHNESS_MAX_MINUTES
    # the schedule check warns when the last hour's p95 of fetches' lateness is longer
    lateness_max_minutes: int = DEFAULT_LATENESS_MAX_MINUTES
    run_retention_days: int = DEFAULT_RUN_RETENTION_DAYS
    # new sources learn their interval (``sources add`` and imports, unless told)
    adaptive_cadence: bool = False
    adaptive_min_minutes: int = DEFAULT_ADAPTIVE_MIN_MINUTES  # bounds of a source that sets none
    adaptive_max_minutes: int = DEFAULT_ADAPTIVE_MAX_MINUTES
    alert_limit: int = DEFAULT_ALERT_LIMIT  # alerts a user hears one by one per window
    alert_window_minutes: int = DEFAULT_ALERT_WINDOW_MINUTES
    # an owned source's owner is told it fails after this many failed fetches in a row
    # (at once for a block or a disable: pipeline/fetching/decide.py ``owner_alert``)
    owner_alert_failures: int = DEFAULT_OWNER_ALERT_FAILURES
    # Where the operator hears of failed runs and failing checks (pipeline/notify/operator.py):
    # an http(s) URL is a webhook signed under the secret, any other an Apprise URL; None: nowhere.
    operator_alert_url: str | None = field(default=None, repr=False)  # may hold a token
    operator_alert_secret: str | None = field(default=None, repr=False)
    # The bearer token Alertmanager's webhook brings to `pipeline serve`'s /alertmanager,
    # which tells the operator's channel its alerts (pipeline/notify/operator.py); None:
    # there is no such path.
    alertmanager_token: str | None = field(default=None, repr=False)
    ui_url: str = DEFAULT_UI_URL  # the Dagster UI, for the links in those alerts
    # Where readers reach `pipeline serve` (its output feeds' URLs start with it); None:
    # the address it listens on, or, in a feed, the request's own host.
    public_url: str | None = None
    # WebSub (pipeline/fetching/websub.py): the base URL hubs reach `pipeline serve` at,
    # whose /websub/ paths take their verifications and pushes; None: no subscriptions.
    websub_callback_url: str | None = None
    # A pushed source is still polled, this often (hours): a safety net for lost pushes.
    websub_safety_hours: int = DEFAULT_WEBSUB_SAFETY_HOURS
    # Pushes a subscription's callback takes in a minute (each `pipeline serve`); more are
    # answered 429 Too Many Requests, which hubs retry later.
    websub_pushes_per_minute: int = DEFAULT_WEBSUB_PUSHES_PER_MINUTE
    # A subscription's secret goes to an https hub, or one on this machine (loopback);
    # "on" sends it to plain-http hubs elsewhere too, where anyone on the way can read it
    # and forge pushes (WebSub: it SHOULD go over https only).
    websub_plain_http_hubs: bool = False

    def max_runs(self, stage: str) -> int:
        """Runs of ``stage`` (one of STAGES) in flight at once: PIPELINE_<STAGE>_MAX_RUNS."""
        return self.stage_max_runs[STAGES.index(stage)]

    def __post_init__(self) -> None:
        low, high = self.adaptive_min_minutes, self.adaptive_max_minutes
        if not MIN_INTERVAL_MINUTES <= low <= high <= MAX_INTERVAL_MINUTES:
            raise ConfigError(
                f"PIPELINE_ADAPTIVE_MIN_MINUTES={low} and PIPELINE_ADAPTIVE_MAX_MINUTES={high}: need"
                f" {MIN_INTERVAL_MINUTES} <= min <= max <= {MAX_INTERVAL_MINUTES}"
            )

    @classmethod
    def from_env(cls) -> Settings:
        networks = os.environ.get("PIPELINE_ALLOW_NETWORKS", "")
        return cls(
            database_url=os.environ.get("DATABASE_URL", "").strip() or default_database_url(),
            lease_seconds=_int_env("PIPELINE_LEASE_SECONDS", DEFAULT_LEASE_SECONDS),
            http_timeout_seconds=_float_env(
                "PIPELINE_HTTP_TIMEOUT_SECONDS", DEFAULT_HTTP_TIMEOUT_SECONDS
            ),
            max_response_bytes=_int_env("PIPELINE_MAX_RESPONSE_BYTES", DEFAULT_MAX_RESPONSE_BYTES),
            max_items_per_fetch=_int_env("PIPELINE_MAX_ITEMS_PER_FETCH", DEFAULT_MAX_ITEMS_PER_FETCH),
            concurrency=_int_env("PIPELINE_CONCURRENCY", DEFAULT_CONCURRENCY),
            allow_networks=tuple(n.strip() for n in networks.split(",") if n.strip()),
            raw_max_attempts=_int_env("PIPELINE_RAW_MAX_ATTEMPTS", DEFAULT_RAW_MAX_ATTEMPTS),
            source_max_attempts=_int_env(
                "PIPELINE_SOURCE_MAX_ATTEMPTS", DEFAULT_SOURCE_MAX_ATTEMPTS
            ),
            delivery_max_attempts=_int_env(
                "PIPELINE_DELIVERY_MAX_ATTEMPTS", DEFAULT_DELIVERY_MAX_ATTEMPTS
            ),
            politeness_group_by=_choice_env("PIPELINE_POLITENESS_GROUP_BY", ("host", "domain")),
            raw_retention_days=_int_env("PIPELINE_RAW_RETENTION_DAYS", DEFAULT_RAW_RETENTION_DAYS),
            event_retention_days=_int_env(
                "PIPELINE_EVENT_RETENTION_DAYS", DEFAULT_EVENT_RETENTION_DAYS
            ),
            sensor_interval_seconds=_int_env(
                "PIPELINE_SENSOR_INTERVAL_SECONDS", DEFAULT_SENSOR_INTERVAL_SECONDS,
                minimum=MIN_SENSOR_INTERVAL_SECONDS,
            ),
            ingest_linger_seconds=_int_env(
                "PIPELINE_INGEST_LINGER_SECONDS", DEFAULT_INGEST_LINGER_SECONDS, minimum=0
            ),
            stage_max_runs=tuple(
                _int_env(f"PIPELINE_{stage.upper()}_MAX_RUNS", DEFAULT_MAX_RUNS) for stage in STAGES
            ),
            stale_lease_minutes=_int_env("PIPELINE_STALE_LEASE_MINUTES", DEFAULT_STALE_LEASE_MINUTES),
            freshness_max_minutes=_int_env("PIPELINE_FRESHNESS_MAX_MINUTES", DEFAULT_FRESHNESS_MAX_MINUTES),
            lateness_max_minutes=_int_env("PIPELINE_LATENESS_MAX_MINUTES", DEFAULT_LATENESS_MAX_MINUTES),
            run_retention_days=_int_env("PIPELINE_RUN_RETENTION_DAYS", DEFAULT_RUN_RETENTION_DAYS),
            adaptive_cadence=_choice_env("PIPELINE_ADAPTIVE_CADENCE", ("off", "on")) == "on",
            adaptive_min_minutes=_int_env("PIPELINE_ADAPTIVE_MIN_MINUTES", DEFAULT_ADAPTIVE_MIN_MINUTES),
            adaptive_max_minutes=_int_env("PIPELINE_ADAPTIVE_MAX_MINUTES", DEFAULT_ADAPTIVE_MAX_MINUTES),
            alert_limit=_int_env("PIPELINE_ALERT_LIMIT", DEFAULT_ALERT_LIMIT),
            alert_window_minutes=_int_env("PIPELINE_ALERT_WINDOW_MINUTES", DEFAULT_ALERT_WINDOW_MINUTES),
            owner_alert_failures=_int_env("PIPELINE_OWNER_ALERT_FAILURES", DEFAULT_OWNER_ALERT_FAILURES),
            operator_alert_url=os.environ.get("PIPELINE_OPERATOR_ALERT_URL", "").strip() or None,
            operator_alert_secret=os.environ.get("PIPELINE_OPERATOR_ALERT_SECRET", "").strip() or None,
            alertmanager_token=os.environ.get("PIPELINE_ALERTMANAGER_TOKEN", "").strip() or None,
            ui_url=(os.environ.get("PIPELINE_UI_URL", "").strip() or DEFAULT_UI_URL).rstrip("/"),
            public_url=_url_env("PIPELINE_PUBLIC_URL"),
            websub_callback_url=_url_env("PIPELINE_WEBSUB_CALLBACK_URL"),
            websub_safety_hours=_int_env("PIPELINE_WEBSUB_SAFETY_HOURS", DEFAULT_WEBSUB_SAFETY_HOURS),
            websub_pushes_per_minute=_int_env("PIPELINE_WEBSUB_PUSHES_PER_MINUTE", DEFAULT_WEBSUB_PUSHES_PER_MINUTE),
            websub_plain_http_hubs=_choice_env("PIPELINE_WEBSUB_PLAIN_HTTP_HUBS", ("off", "on")) == "on",
        )

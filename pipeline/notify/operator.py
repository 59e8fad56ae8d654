"""Telling the operator when the pipeline needs a person: a Dagster run failed, an asset
check started failing, or a failing one passes again, a sensor's or schedule's ticks
started failing, or work again (sensors/alerts.py decides when), or
a Prometheus alert fires or resolves (Alertmanager's webhook to `pipeline serve`,
``from_alertmanager``).

Alerts go to ``PIPELINE_OPERATOR_ALERT_URL``: an ``http(s)://`` URL is a webhook, sent
the JSON body of ``OperatorAlert.body`` and signed as users' webhooks are (Standard
Webhooks, pipeline/notify/delivery.py) under ``PIPELINE_OPERATOR_ALERT_SECRET``; any
other URL is an Apprise URL (``mailto://``, ``slack://``, ``json://``, ...), sent the
title and text. Both go through the SSRF guard (``PIPELINE_ALLOW_NETWORKS`` permits a
private network). Every alert carries an idempotency key that is the same each time
that alert is sent, so a receiver drops a repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pipeline.core.errors import DeliveryError, UserError
from pipeline.core.failures import FailureReason
from pipeline.core.settings import Settings
from pipeline.net.http import Fetcher
from pipeline.notify.delivery import AppriseChannel, WebhookChannel, json_body

RUN_FAILED, CHECK_FAILING, CHECK_PASSING = "run_failed", "check_failing", "check_passing"
# A sensor or schedule whose ticks fail (the daemon records each tick), and one working again.
TICKS_FAILING, TICKS_WORKING = "ticks_failing", "ticks_working"
# A run's step retrying after a failure (the database refusing writes, gone for a while),
# and the same run working again: told while the run lives, before it fails or succeeds.
STEP_RETRYING, STEP_WORKING = "step_retrying", "step_working"
# `pipeline operator`: a message, a test, and what `dev.py up` tells when it restarts a
# stack whose Dagster services died.
MESSAGE, TEST, STACK_RESTARTED = "message", "test", "stack_restarted"
# A Prometheus alert (deploy/prometheus/alerts.yml) as Alertmanager sends it on.
ALERT_FIRING, ALERT_RESOLVED = "alert_firing", "alert_resolved"
ALERTS_PER_MESSAGE = 100  # an Alertmanager message holds at most this many alerts told


@dataclass(frozen=True)
class OperatorAlert:
    key: str  # the idempotency key: the same for every send of this alert
    event: str  # one of the event names above
    title: str
    text: str  # plain text
    link: str | None = None  # where the UI shows it
    details: dict[str, Any] = field(default_factory=dict)

    def body(self) -> bytes:
        return json_body({"idempotency_key": self.key, "event": self.event, "title": self.title, "text": self.text,
                          "link": self.link, "details": self.details})

    def message(self) -> str:
        """The text with its link, for a channel that is not JSON."""
        return f"{self.text}\n\n{self.link}" if self.link else self.text


def configured(settings: Settings) -> bool:
    return settings.operator_alert_url is not None


def send(settings: Settings, alert: OperatorAlert) -> None:
    """Send ``alert`` to the operator's channel; DeliveryError says why it was not
    delivered (a sensor raises it, so its tick fails and the alert is tried again)."""
    url = settings.operator_alert_url
    if url is None:
        raise DeliveryError("PIPELINE_OPERATOR_ALERT_URL is not set", code=FailureReason.INVALID_CONFIG)
    with Fetcher.from_settings(settings) as fetcher:
        if urlsplit(url).scheme.lower() in ("http", "https"):
            if not settings.operator_alert_secret:
                raise DeliveryError(
                    "PIPELINE_OPERATOR_ALERT_URL is a webhook: set PIPELINE_OPERATOR_ALERT_SECRET to sign its alerts",
                    code=FailureReason.INVALID_CONFIG)
            WebhookChannel(fetcher).post(url, alert.body(), alert.key, [settings.operator_alert_secret])
        else:
            AppriseChannel(fetcher.guard).notify(url, alert.title, alert.message())


def from_alertmanager(message: Any) -> list[OperatorAlert]:
    """The alerts of an Alertmanager webhook ``message`` (its JSON, version 4), each
    firing or resolved, as operator alerts; UserError (a PipelineError) names what is
    malformed. An alert's key is its fingerprint, status and start: the same alert told
    again (Alertmanager repeats) is dropped by a receiver that keeps the key."""
    if not isinstance(message, dict) or not isinstance(message.get("alerts"), list):
        raise UserError("not an Alertmanager message: no list of alerts")
    if len(message["alerts"]) > ALERTS_PER_MESSAGE:
        raise UserError(f"an Alertmanager message of {len(message['alerts'])} alerts: at most {ALERTS_PER_MESSAGE}")
    told = []
    for alert in message["alerts"]:
        if not isinstance(alert, dict):
            raise UserError("an alert that is not an object")
        labels, notes = alert.get("labels") or {}, alert.get("annotations") or {}
        if not isinstance(labels, dict) or not isinstance(notes, dict):
            raise UserError("an alert whose labels or annotations are not objects")
        name, status = str(labels.get("alertname", "an alert")), str(alert.get("status", ""))
        if status not in ("firing", "resolved"):
            raise UserError(f"an alert whose status is {status[:40]!r}, not firing or resolved")
        summary = str(notes.get("summary") or name)
        firing = status == "firing"
        title = (f"Prometheus alert {name} ({labels.get('severity', 'no severity')}): {summary}" if firing
                 else f"Prometheus alert {name} resolved: {summary}")
        text = "\n".join(str(part) for part in (title, notes.get("description"),
                                                  ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))) if part)
        key = f"alert-{alert.get('fingerprint', name)}-{status}-{alert.get('startsAt', '')}"
        told.append(OperatorAlert(
            key=key[:200], event=ALERT_FIRING if firing else ALERT_RESOLVED, title=title[:500], text=text[:4000],
            link=str(alert.get("generatorURL") or message.get("externalURL") or "") or None,
            details={"labels": {str(k): str(v) for k, v in labels.items()}, "status": status,
                     "starts_at": alert.get("startsAt"), "ends_at": alert.get("endsAt")},
        ))
    return told

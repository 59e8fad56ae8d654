"""Telling the operator when the pipeline needs a person: a Dagster run failed, an asset
check started failing, or a failing one passes again (sensors/alerts.py decides when).

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

from pipeline.core.errors import DeliveryError
from pipeline.core.failures import FailureReason
from pipeline.core.settings import Settings
from pipeline.net.http import Fetcher
from pipeline.notify.delivery import AppriseChannel, WebhookChannel, json_body

RUN_FAILED, CHECK_FAILING, CHECK_PASSING = "run_failed", "check_failing", "check_passing"


@dataclass(frozen=True)
class OperatorAlert:
    key: str  # the idempotency key: the same for every send of this alert
    event: str  # RUN_FAILED, CHECK_FAILING or CHECK_PASSING
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

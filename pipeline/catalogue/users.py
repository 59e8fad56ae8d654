"""Users, their delivery channel and their filters; steering notifications.

Everything is validated before it is written, and errors name what is wrong. Secrets
(webhook secrets, Apprise URLs, which hold tokens) are never shown in full.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import apprise
import sqlalchemy as sa

from pipeline.core.errors import UserError
from pipeline.core.inputs import TEXT_CHARS, URL_CHARS, text_problem
from pipeline.core.kinds import ChannelKind
from pipeline.core.redact import channel_url
from pipeline.notify.matching import parse_keywords
from pipeline.storage import schema


@dataclass(frozen=True)
class NewUser:
    id: int
    secret: str | None  # the webhook secret, when it was generated (shown once)


def add_user(
    conn: sa.Connection, name: str, *, webhook: str | None = None, secret: str | None = None,
    apprise_url: str | None = None,
) -> NewUser:
    name = name.strip()
    if not name:
        raise UserError("a user needs a name")
    for field, value, limit in (("name", name, TEXT_CHARS), ("the webhook URL", webhook, URL_CHARS),
                                ("the Apprise URL", apprise_url, URL_CHARS), ("the secret", secret, TEXT_CHARS)):
        if value is not None and (problem := text_problem(value, field, limit)):
            raise UserError(problem)
    if (webhook is None) == (apprise_url is None):
        raise UserError("give exactly one channel: --webhook URL or --apprise URL")
    generated = None
    if webhook is not None:
        parts = urlsplit(webhook)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"webhook {channel_url(webhook)} is not an http(s) URL")
        if secret is not None and len(secret) < 16:
            raise UserError("a webhook secret must be at least 16 characters")
        if secret is None:
            secret = generated = secrets.token_urlsafe(32)
        channel, url = ChannelKind.WEBHOOK, webhook
    else:
        assert apprise_url is not None
        if secret is not None:
            raise UserError("a webhook secret signs webhooks; an Apprise URL carries its own credentials")
        if not apprise.Apprise().add(apprise_url):
            raise UserError(f"{channel_url(apprise_url)} is not a URL Apprise can send to")
        channel, url = ChannelKind.APPRISE, apprise_url
    t = schema.users
    if conn.execute(sa.select(t.c.id).where(t.c.name == name)).first() is not None:
        raise UserError(f"a user named {name!r} exists already")
    user_id = conn.execute(
        sa.insert(t).values(name=name, channel=channel, channel_url=url, secret=secret).returning(t.c.id)
    ).scalar_one()
    return NewUser(int(user_id), generated)


def find_user(conn: sa.Connection, user: str) -> int:
    """A user's id, by name or by id."""
    t = schema.users
    found = conn.execute(sa.select(t.c.id).where(t.c.name == user)).scalar()
    if found is None and user.isdigit():
        found = conn.execute(sa.select(t.c.id).where(t.c.id == int(user))).scalar()
    if found is None:
        raise UserError(f"no user named (or with id) {user!r}")
    return int(found)


def add_filter(
    conn: sa.Connection, user: str, keywords: str, *, source_id: int | None = None,
    category: str | None = None,
) -> int:
    """Add a filter; it applies to listings that arrive from now on."""
    user_id = find_user(conn, user)
    for field, value in (("the filter's words", keywords), ("category", category)):
        if value is not None and (problem := text_problem(value, field)):
            raise UserError(problem)
    try:
        words = parse_keywords(keywords)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if source_id is not None:
        s = schema.sources
        if conn.execute(sa.select(s.c.id).where(s.c.id == source_id)).first() is None:
            raise UserError(f"no source with id {source_id}")
    category = (category or "").strip() or None
    t = schema.filters
    return int(conn.execute(
        sa.insert(t).values(user_id=user_id, keywords=list(words), source_id=source_id, category=category)
        .returning(t.c.id)
    ).scalar_one())


def list_users(conn: sa.Connection) -> list[dict[str, Any]]:
    t = schema.users
    rows = conn.execute(sa.select(t.c.id, t.c.name, t.c.channel, t.c.channel_url, t.c.enabled).order_by(t.c.id))
    return [
        {"id": r.id, "name": r.name, "channel": r.channel,
         "target": channel_url(r.channel_url),  # webhook paths can hold tokens too
         "enabled": r.enabled}
        for r in rows
    ]


def list_filters(conn: sa.Connection) -> list[dict[str, Any]]:
    f, u = schema.filters, schema.users
    rows = conn.execute(
        sa.select(f.c.id, u.c.name, f.c.keywords, f.c.source_id, f.c.category, f.c.enabled, f.c.created_at)
        .join(u, u.c.id == f.c.user_id).order_by(f.c.id)
    )
    return [dict(r._mapping) for r in rows]


def set_filter_enabled(conn: sa.Connection, filter_id: int, enabled: bool) -> None:
    t = schema.filters
    if conn.execute(sa.update(t).where(t.c.id == filter_id).values(enabled=enabled)).rowcount == 0:
        raise UserError(f"no filter with id {filter_id}")

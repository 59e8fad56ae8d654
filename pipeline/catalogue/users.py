"""Users, their delivery channel and their filters; steering notifications.

Everything is validated before it is written, and errors name what is wrong. Secrets
(webhook secrets, Apprise URLs, which hold tokens) are never shown in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from pipeline.core.errors import UserError
from pipeline.core.inputs import TEXT_CHARS, URL_CHARS, as_id, text_problem
from pipeline.core.kinds import ChannelKind, NotificationStatus
from pipeline.core.prices import condition_problem
from pipeline.core.redact import channel_digest, channel_url, names_a_host
from pipeline.notify.query import Query, QueryError, as_written, compile_query, parse, source_terms
from pipeline.notify.schedule import FILTER_MODES, DeliveryPlan
from pipeline.notify.signing import new_secret, secret_problem
from pipeline.storage import schema

if TYPE_CHECKING:
    from pipeline.net.http import AddressGuard

# The notifier's helpers are imported by the functions that use them: listing users
# loads neither the notifier nor the fetcher (tests/test_cli.py holds it).

MIN_SECRET_CHARS = 16  # a webhook secret's shortest

@dataclass(frozen=True)
class NewUser:
    id: int
    secret: str | None  # the webhook secret, when it was generated (shown once)


def _channel_host(url: str, what: str) -> str | None:
    """The host ``url`` sends to, where its scheme names one (None for a service's own
    URL, such as ``tgram://TOKEN``); UserError for a URL that does not parse."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parses the port: a malformed one raises here)
    except ValueError as exc:
        raise UserError(f"{what} {channel_url(url)} is not a usable URL: {exc}") from None
    scheme = parts.scheme.lower()
    return parts.hostname if parts.hostname and scheme and names_a_host(scheme) else None


def _check_guard(url: str, what: str, guard: AddressGuard | None) -> None:
    """Refuse a channel whose host the SSRF guard refuses (every send would be)."""
    host = _channel_host(url, what)
    if guard is not None and host and (refused := guard.refused_host(host)):
        raise UserError(
            f"{what} {channel_url(url)} sends to {', '.join(refused)}, which the address guard refuses"
            " (loopback, private or reserved); PIPELINE_ALLOW_NETWORKS permits a network")


def add_user(
    conn: sa.Connection, name: str, *, webhook: str | None = None, secret: str | None = None,
    apprise_url: str | None = None, guard: AddressGuard | None = None,
) -> NewUser:
    """Add a user with one channel. ``guard``: refuse a channel it would refuse at every
    send (the command line passes the settings' guard)."""
    name = name.strip()
    if not name:
        raise UserError("a user needs a name")
    if problem := text_problem(name, "name", TEXT_CHARS):
        raise UserError(problem)
    channel, url, secret, generated = _checked_channel(webhook, secret, apprise_url, guard)
    t = schema.users
    if conn.execute(sa.select(t.c.id).where(t.c.name == name)).first() is not None:
        raise UserError(f"a user named {name!r} exists already")
    user_id = conn.execute(
        sa.insert(t).values(name=name, channel=channel, channel_url=url, secret=secret).returning(t.c.id)
    ).scalar_one()
    return NewUser(int(user_id), generated)


def _checked_channel(
    webhook: str | None, secret: str | None, apprise_url: str | None, guard: AddressGuard | None,
) -> tuple[ChannelKind, str, str | None, str | None]:
    """A user's one channel, validated: its kind, its URL, the webhook's secret (None for
    Apprise) and that secret again when it was generated (shown once)."""
    for field, value, limit in (("the webhook URL", webhook, URL_CHARS), ("the Apprise URL", apprise_url, URL_CHARS),
                                ("the secret", secret, TEXT_CHARS)):
        if value is not None and (problem := text_problem(value, field, limit)):
            raise UserError(problem)
    if (webhook is None) == (apprise_url is None):
        raise UserError("give exactly one channel: --webhook URL or --apprise URL")
    generated = None
    if webhook is not None:
        _channel_host(webhook, "webhook")
        parts = urlsplit(webhook)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"webhook {channel_url(webhook)} is not an http(s) URL")
        _check_guard(webhook, "webhook", guard)
        if secret is None:
            secret = generated = new_secret()
        else:
            _check_secret(secret)
        channel, url = ChannelKind.WEBHOOK, webhook
    else:
        assert apprise_url is not None
        if secret is not None:
            raise UserError("a webhook secret signs webhooks; an Apprise URL carries its own credentials")
        import apprise  # 0.2 s of imports: only where an Apprise URL is checked

        _channel_host(apprise_url, "Apprise URL")
        parsed = apprise.Apprise()
        if not parsed.add(apprise_url):
            raise UserError(f"{channel_url(apprise_url)} is not a URL Apprise can send to")
        if len(parsed) != 1:
            # Apprise splits a string at spaces and commas: the guard's check would read
            # the first URL, and the sends go to all of them.
            raise UserError(f"{channel_url(apprise_url)} holds {len(parsed)} Apprise URLs: a channel is one URL")
        _check_guard(apprise_url, "Apprise URL", guard)
        channel, url = ChannelKind.APPRISE, apprise_url
    return channel, url, secret, generated


def _check_secret(secret: str) -> None:
    if len(secret) < MIN_SECRET_CHARS:
        raise UserError(f"a webhook secret must be at least {MIN_SECRET_CHARS} characters")
    if problem := secret_problem(secret):
        raise UserError(problem)


def rotate_secret(conn: sa.Connection, user: str, secret: str, overlap: timedelta, *, now: datetime | None = None) -> None:
    """Give a webhook user a new secret; the old one keeps signing beside it for
    ``overlap`` (both signatures go with every delivery: Standard Webhooks allows
    several), so the receiver can switch to the new one without refusing a delivery."""
    user_id = find_user(conn, user)
    if problem := text_problem(secret, "the secret", TEXT_CHARS):
        raise UserError(problem)
    _check_secret(secret)
    if not timedelta(0) <= overlap <= timedelta(days=30):
        raise UserError("the overlap is 0 to 720 hours")
    t = schema.users
    channel, old = conn.execute(sa.select(t.c.channel, t.c.secret).where(t.c.id == user_id)).one()
    if channel != ChannelKind.WEBHOOK:
        raise UserError(f"user {user!r} is notified through Apprise, whose URL carries its own credentials")
    if secret == old:
        raise UserError("the new secret is the one in use")
    until = (now or datetime.now(UTC)) + overlap
    conn.execute(sa.update(t).where(t.c.id == user_id).values(
        secret=secret, previous_secret=old if overlap else None, previous_secret_until=until if overlap else None))


def find_user(conn: sa.Connection, user: str) -> int:
    """A user's id, by name or by id."""
    t = schema.users
    found = conn.execute(sa.select(t.c.id).where(t.c.name == user)).scalar()
    if found is None and (user_id := as_id(user)) is not None:
        found = conn.execute(sa.select(t.c.id).where(t.c.id == user_id)).scalar()
    if found is None:
        raise UserError(f"no user named (or with id) {user!r}")
    return int(found)


def add_filter(
    conn: sa.Connection, user: str, query: str, *, source_id: int | None = None,
    category: str | None = None, changes: bool = False, price_drop: float | None = None,
    price_below: float | None = None,
) -> int:
    """Add a filter written in the filter language (pipeline/notify/query.py); it applies
    to listings that arrive from now on. A malformed filter is refused with the position
    of what is wrong; a ``source:`` must name a source that exists. ``changes``: its user
    also hears when a listing it notified them of changes or goes (pipeline/storage/watches.py);
    ``price_drop`` (a percent) and ``price_below`` (an amount): only changes of the price
    that meet one (pipeline/core/prices.py), and they imply ``changes``."""
    user_id = find_user(conn, user)
    if category is not None and (problem := text_problem(category, "category")):
        raise UserError(problem)
    if problem := condition_problem(price_drop, price_below):
        raise UserError(problem)
    changes = changes or price_drop is not None or price_below is not None
    compiled = compile_filter(conn, query)
    if source_id is not None and not _source_exists(conn, source_id):
        raise UserError(f"no source with id {source_id}")
    category = (category or "").strip() or None
    t = schema.filters
    return int(conn.execute(
        sa.insert(t).values(user_id=user_id, keywords=list(compiled.words), query=compiled.text,
                            source_id=source_id, category=category, changes=changes, price_drop=price_drop,
                            price_below=price_below)
        .returning(t.c.id)
    ).scalar_one())


def compile_filter(conn: sa.Connection, query: str) -> Query:
    """``query`` compiled as a filter is: refused with the position of what is wrong, and
    when a ``source:`` names no source that exists."""
    if problem := text_problem(query, "the filter"):
        raise UserError(problem)
    try:
        terms = source_terms(parse(query))
        # Every source's name, only for a filter that names one: read for every filter, it
        # made adding 30,000 filters beside 100,000 sources take hours (bench/soak_stack.py).
        from pipeline.notify.notifier import source_ids_by_name

        names = source_ids_by_name(conn) if terms else {}
        for term in terms:
            source_id = as_id(term.value)
            if term.value not in names and not (source_id is not None and _source_exists(conn, source_id)):
                raise QueryError(f"no source named (or with id) {term.value!r}", term.position)
        return compile_query(query, names)
    except QueryError as exc:
        written = query.strip()
        shown = written if len(written) <= 80 else f"{written[:77]}..."
        raise UserError(f"filter {shown!r}: {exc}") from None


def _source_exists(conn: sa.Connection, source_id: int) -> bool:
    s = schema.sources
    return conn.execute(sa.select(s.c.id).where(s.c.id == source_id)).first() is not None


def set_delivery(
    conn: sa.Connection, user: str, *, digest: str | None = None, quiet: str | None = None,
    timezone: str | None = None, now: datetime | None = None,
) -> DeliveryPlan:
    """Change when a user hears (pipeline/notify/schedule.py); settings not given stay.
    The notifications waiting for a digest or the end of quiet hours are re-timed by the
    new plan (a new time zone moves them; back to immediate releases them now, as one
    digest). Running notifiers see the change within their filter reload (60 s)."""
    user_id = find_user(conn, user)
    t, n = schema.users, schema.notifications
    old = conn.execute(sa.select(t.c.digest, t.c.quiet_hours, t.c.timezone).where(t.c.id == user_id)).one()
    values = {
        "digest": old.digest if digest is None else digest.strip().lower(),
        "quiet_hours": old.quiet_hours if quiet is None else quiet.strip().lower(),
        "timezone": old.timezone if timezone is None else timezone.strip(),
    }
    plan = DeliveryPlan.parse(values["digest"], values["quiet_hours"], values["timezone"])
    values = {  # stored as NULL where they say the default
        "digest": None if plan.every is None and plan.daily_at is None else values["digest"],
        "quiet_hours": None if plan.quiet is None else values["quiet_hours"],
        "timezone": None if values["timezone"] in (None, "", "UTC") else values["timezone"],
    }
    conn.execute(sa.update(t).where(t.c.id == user_id).values(values))
    now = now or datetime.now(UTC)
    conn.execute(
        sa.update(n)
        .where(n.c.user_id == user_id, n.c.status == NotificationStatus.HELD, n.c.digest_id.is_(None))
        .values(next_attempt_at=plan.release_at(now) or now)
    )
    return plan


def describe_delivery(digest: str | None, quiet: str | None, timezone: str | None) -> str:
    """A user's delivery settings in one phrase, as ``users list`` shows them."""
    parts = [f"digest {digest}" if digest else "immediate"]
    if quiet:
        parts.append(f"quiet {quiet}")
    if timezone:
        parts.append(timezone)
    return ", ".join(parts)


def list_users(conn: sa.Connection, user: str | None = None) -> list[dict[str, Any]]:
    """Every user with their channel and delivery settings; ``user`` (a name or id): that one only."""
    t = schema.users
    query = sa.select(t.c.id, t.c.name, t.c.channel, t.c.channel_url, t.c.enabled, t.c.digest,
                      t.c.quiet_hours, t.c.timezone).order_by(t.c.id)
    if user is not None:
        query = query.where(t.c.id == find_user(conn, user))
    rows = conn.execute(query).all()
    g = schema.gone_channels
    gone = {digest: at for digest, at in conn.execute(sa.select(g.c.digest, g.c.gone_at).where(
        g.c.user_id.in_([r.id for r in rows])))} if rows else {}
    return [
        {"id": r.id, "name": r.name, "channel": r.channel,
         "target": channel_url(r.channel_url),  # webhook paths can hold tokens too
         "enabled": r.enabled, "digest": r.digest or "immediate", "quiet_hours": r.quiet_hours,
         "timezone": r.timezone or "UTC",
         "delivery": describe_delivery(r.digest, r.quiet_hours, r.timezone),
         # Its receiver answered 410 Gone then: its notifications are held (`users channel` sends them).
         "gone_since": gone.get(channel_digest(r.channel_url))}
        for r in rows
    ]


def list_filters(conn: sa.Connection, user: str | None = None) -> list[dict[str, Any]]:
    """Every filter with its user's name; ``user`` (a name or id): that user's only."""
    f, u = schema.filters, schema.users
    query = (sa.select(f.c.id, u.c.name, f.c.keywords, f.c.query, f.c.source_id, f.c.category, f.c.changes,
                       f.c.price_drop, f.c.price_below, f.c.channel, f.c.channel_url, f.c.mode, f.c.enabled,
                       f.c.created_at, f.c.error, f.c.failed_at)
             .join(u, u.c.id == f.c.user_id).order_by(f.c.id))
    if user is not None:
        query = query.where(f.c.user_id == find_user(conn, user))
    rows = conn.execute(query)
    # Its own channel shows as a user's does (scheme and host: a URL can hold a token).
    return [dict(r._mapping) | {"query": as_written(r.query, r.keywords),
                                "channel_url": channel_url(r.channel_url) if r.channel_url else None}
            for r in rows]


def set_user_enabled(conn: sa.Connection, user: str, enabled: bool) -> None:
    """Enable or disable a user (by name or id): a disabled user's filters match nothing,
    and a notification already made for them ends dead when it is tried ("the user is
    disabled"; `notifications requeue` sends it once the user is enabled again)."""
    t = schema.users
    conn.execute(sa.update(t).where(t.c.id == find_user(conn, user)).values(enabled=enabled))


def set_channel(
    conn: sa.Connection, user: str, *, webhook: str | None = None, secret: str | None = None,
    apprise_url: str | None = None, guard: AddressGuard | None = None,
) -> str | None:
    """Give a user another channel (validated as ``add_user`` validates one); the
    notifications not yet sent go to it. Returns the webhook secret when it was generated
    (shown once). A webhook given again keeps its secret unless ``secret`` is given."""
    user_id = find_user(conn, user)
    t = schema.users
    old = conn.execute(sa.select(t.c.channel, t.c.channel_url, t.c.secret).where(t.c.id == user_id)).one()
    if webhook is not None and secret is None and old.channel == ChannelKind.WEBHOOK and old.secret:
        secret = old.secret  # a new address, the receiver's secret as it was
    channel, url, secret, generated = _checked_channel(webhook, secret, apprise_url, guard)
    conn.execute(sa.update(t).where(t.c.id == user_id).values(
        channel=channel, channel_url=url, secret=secret, previous_secret=None, previous_secret_until=None))
    from pipeline.notify.notifier import release_gone

    release_gone(conn, url)
    return generated


def route_filter(
    conn: sa.Connection, filter_id: int, *, webhook: str | None = None, secret: str | None = None,
    apprise_url: str | None = None, user_channel: bool = False, mode: str | None = None,
    guard: AddressGuard | None = None,
) -> str | None:
    """Send a filter's matches through a channel of its own (validated as a user's is),
    or its user's again (``user_channel``), and/or in a mode of its own (``instant``,
    ``digest``; ``user``: the user's again); what is not given stays. Notifications not
    yet sent go the new way. Returns the webhook secret when it was generated (shown once)."""
    f = schema.filters
    if conn.execute(sa.select(f.c.id).where(f.c.id == filter_id)).first() is None:
        raise UserError(f"no filter with id {filter_id}")
    if mode is not None and mode not in (*FILTER_MODES, "user"):
        raise UserError(f"mode {mode!r} is not one of: {', '.join(FILTER_MODES)}, user")
    given = [name for name, value in (("--webhook", webhook), ("--apprise", apprise_url)) if value is not None]
    if user_channel:
        given.append("--user-channel")
    if len(given) > 1:
        raise UserError(f"give one channel, not {' and '.join(given)}")
    if not given and mode is None:
        raise UserError("give a channel (--webhook, --apprise, --user-channel) or a --mode")
    values: dict[str, Any] = {}
    generated = None
    if user_channel:
        values.update(channel=None, channel_url=None, secret=None)
    elif given:
        channel, url, secret, generated = _checked_channel(webhook, secret, apprise_url, guard)
        values.update(channel=channel, channel_url=url, secret=secret)
        from pipeline.notify.notifier import release_gone

        release_gone(conn, url)
    if mode is not None:
        values["mode"] = None if mode == "user" else mode
    conn.execute(sa.update(f).where(f.c.id == filter_id).values(**values))
    return generated


def remove_user(conn: sa.Connection, user: str) -> dict[str, int]:
    """Delete a user (by name or id) with their filters, watches and notifications,
    sent or not: nothing is matched or sent for them from now on (a notifier sending
    one of them as this commits is fenced out when it records the send). Returns how
    many filters and notifications went with them."""
    user_id = find_user(conn, user)
    f, n = schema.filters, schema.notifications
    removed = {
        "filters": conn.execute(sa.select(sa.func.count()).where(f.c.user_id == user_id)).scalar_one(),
        "notifications": conn.execute(sa.select(sa.func.count()).where(n.c.user_id == user_id)).scalar_one(),
    }
    conn.execute(sa.delete(schema.users).where(schema.users.c.id == user_id))  # the rest by ON DELETE CASCADE
    return removed


def remove_filter(conn: sa.Connection, filter_id: int) -> None:
    """Delete a filter. The notifications it made stay (their ``filter_id`` becomes NULL:
    what was sent, was sent); it matches nothing from now on."""
    t = schema.filters
    if conn.execute(sa.delete(t).where(t.c.id == filter_id)).rowcount == 0:
        raise UserError(f"no filter with id {filter_id}")


def set_filter_enabled(conn: sa.Connection, filter_id: int, enabled: bool) -> None:
    t = schema.filters
    if conn.execute(sa.update(t).where(t.c.id == filter_id).values(enabled=enabled)).rowcount == 0:
        raise UserError(f"no filter with id {filter_id}")

"""What may be printed of a value that carries a secret: one home for redaction.

Redaction goes by a URL's structure, not by looking for known secrets in it:

* a channel URL (webhook or Apprise) shows its scheme and host only, and only its scheme
  when the scheme puts a credential where a host would be (``prowl://APIKEY``,
  ``pbul://TOKEN``, ``slack://TokenA/...``: Apprise marks that token private);
* a database URL hides its password and every query value (``?password=`` is a password
  to libpq too), keeping the keys so the shape of the setting stays readable;
* any other URL (a source's) hides its user info, name and password alike (a token is
  often the user name): ``http://bob:PW@host/feed`` shows as ``http://***@host/feed``,
  wherever it is printed, inside a sentence too (``userinfo``).

Known secrets (an API key, say) are scrubbed from text an outside party wrote, such as
an API's error message, whole or truncated: a service that echoes a key cut short
(``AIzaSyA1b2...``) still gives away most of it.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING
from urllib.parse import unquote, unquote_plus, urlsplit

if TYPE_CHECKING:  # imported where used: the command line's --help loads no SQLAlchemy
    import sqlalchemy as sa

MASK = "***"
# A run of at least this many characters of a secret, in the secret's own order, is
# taken for the secret (shorter runs are too likely to be ordinary text).
SECRET_PREFIX_CHARS = 8
_HOST_SCHEMES = ("http", "https")


@functools.cache
def names_a_host(scheme: str) -> bool:
    """Whether ``scheme``'s URLs hold a plain host where a host would be."""
    if scheme in _HOST_SCHEMES:
        return True
    from apprise.manager_plugins import NotificationManager

    try:
        plugin = NotificationManager()[scheme]  # type: ignore[no-untyped-call]
    except KeyError:
        return False  # an unknown scheme: assume the worst
    tokens: dict[str, dict[str, object]] = getattr(plugin, "template_tokens", {})
    token = tokens.get("host")
    return token is not None and not token.get("private")


def channel_url(url: str) -> str:
    """A webhook or Apprise URL fit for logs, errors and listings."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
    except ValueError:
        return "…"
    scheme = parts.scheme.lower()
    if not scheme:
        return _typed(url.strip())
    return f"{scheme}://{host}/…" if host and names_a_host(scheme) else f"{scheme}://…"


def _typed(value: str) -> str:
    """What an operator typed for a URL that has no scheme ("notaurl", "hooks.example.com/T0/
    TOKEN"), shown as far as it is no credential: its first part, less any user info, when
    it names a host or is too short to be a token; the rest as "…"."""
    head, slash, _ = value.partition("/")
    head = head.rpartition("@")[2]
    shown = head if head and ("." in head or len(head) < SECRET_PREFIX_CHARS) else "…"
    return f"{shown}/…" if slash and shown != "…" else shown


def channel_secrets(url: str) -> list[str]:
    """The parts of a channel URL that ``channel_url`` hides and may be credentials: its
    user info, and its path segments and query values of ``SECRET_PREFIX_CHARS`` or more
    characters (a chat service's token is one), to ``scrub`` from text a receiver sent
    back ("404 no route for /hook/TOKEN")."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return [url]
    found = [parts.username, parts.password]
    found += [segment for segment in parts.path.split("/") if len(segment) >= SECRET_PREFIX_CHARS]
    found += [value for pair in parts.query.split("&") for value in pair.split("=")[1:]
              if len(value) >= SECRET_PREFIX_CHARS]
    # As written and as a receiver may echo it decoded ("Ab+cD..." for "Ab%2BcD..."; a
    # query's "+" is a space).
    found += [decoded(part) for part in found if part for decoded in (unquote, unquote_plus)]
    return sorted({secret for secret in found if secret and len(secret) > 1}, key=len, reverse=True)


# scheme://USERINFO@ at the start of a URL, in a URL alone or inside a sentence.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")


_DATABASE_SCHEME = re.compile(r"(?i)(postgres(ql)?|mysql|mariadb|sqlite)(\+\w+)?://")


def userinfo(text: str) -> str:
    """``text`` with the user info of every URL in it masked (``http://***@host/``); a
    database URL's is left as ``database_url`` shows it (the user, never a password)."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: m.group(0) if _DATABASE_SCHEME.fullmatch(m.group(1)) else f"{m.group(1)}{MASK}@",
                         text)


def database_url(url: sa.URL | str) -> str:
    """A database URL with its password and every query value hidden. An "@" SQLAlchemy
    reads as part of the host or the database (one in the password, not written %40, or
    a ":" or "/" in the user name) ends what the operator meant as user and password:
    everything before the last "@" is hidden."""
    if isinstance(url, str):
        from sqlalchemy import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(url)
        except (ArgumentError, ValueError):  # ValueError: a port that is not a number
            return "<unparseable URL>"
    where = f"{url.host or ''}{'' if url.port is None else f':{url.port}'}/{url.database or ''}"
    if "@" in where:
        shown = f"{url.drivername}://{MASK}@{where.rsplit('@', 1)[1]}"
    else:
        shown = url.set(query={}).render_as_string(hide_password=True)
    return shown + ("?" + "&".join(f"{key}={MASK}" for key in url.query) if url.query else "")


def scrub(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with each secret, and every run of ``SECRET_PREFIX_CHARS`` or more of its
    leading characters (a truncated echo), replaced by ``MASK``."""
    for secret in secrets:
        if not secret or len(secret) < SECRET_PREFIX_CHARS:
            if secret and secret in text:
                text = text.replace(secret, MASK)
            continue
        # The longest prefix of the secret that appears, as long as it is long enough.
        head = re.escape(secret[:SECRET_PREFIX_CHARS])
        rest = "".join(f"(?:{re.escape(c)}" for c in secret[SECRET_PREFIX_CHARS:])
        closing = ")?" * (len(secret) - SECRET_PREFIX_CHARS)
        text = re.sub(head + rest + closing, MASK, text)
    return text


def channel_digest(url: str) -> str:
    """A channel's stand-in where it is kept apart from its owner (``gone_channels``):
    its URL's SHA-256, since the URL can be a credential."""
    return hashlib.sha256(url.encode()).hexdigest()

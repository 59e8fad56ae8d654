"""What counts as the same URL, and the same item, for dedupe: one rule, used on add,
import and matching (docs/runbook.md, "Duplicates").

Two URLs are the same when they differ only in what RFC 3986 says cannot change the
resource: the case of the scheme and host, a default port (80 for http, 443 for https),
an empty path (``/``), the case of percent-escapes, and the fragment (never sent to the
server). Everything else stays significant: the path and query are case-sensitive, a
trailing slash, ``www.``, query order and tracking parameters can name other resources.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import urlsplit, urlunsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ESCAPE = re.compile(r"%[0-9a-fA-F]{2}")


def canonical_url(url: str) -> str:
    """``url`` in its canonical spelling (see the module docstring); a URL that cannot
    be parsed comes back as given, stripped."""
    value = url.strip()
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return value
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if not scheme or not host:
        return value
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (f"{userinfo}@" if userinfo else "") + host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc += f":{port}"
    path = _ESCAPE.sub(lambda m: m.group(0).upper(), parts.path) or "/"
    query = _ESCAPE.sub(lambda m: m.group(0).upper(), parts.query)
    return urlunsplit((scheme, netloc, path, query, ""))


def item_key(url: str, source_item_id: str) -> str:
    """The identity of an item for "a user hears about it once": its canonical URL with
    its feed id (guid, Atom id, or what stands in for one). The same entry reached
    through two sources (two spellings of a feed, a mirror, feeds that redirect to one)
    has one key; two entries that share a link but not an id (a page watched for
    changes, a feed linking every item to its home page) have two."""
    text = f"{canonical_url(url)}\n{source_item_id}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

"""What counts as the same URL, and the same item, for dedupe: one rule, used on add,
import and matching (docs/runbook.md, "Duplicates").

Two URLs are the same when they differ only in what RFC 3986 says cannot change the
resource: the case of the scheme and host, a default port (80 for http, 443 for https),
an empty path (``/``), the case of percent-escapes, and the fragment (never sent to the
server). Everything else stays significant: the path and query are case-sensitive, a
trailing slash, ``www.``, query order and tracking parameters can name other resources.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
import socket
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

import tldextract

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ESCAPE = re.compile(r"%[0-9a-fA-F]{2}")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)\Z")
_NUMERIC = re.compile(r"[0-9a-fx.]+\Z")
# What stays as it is in a path, query or fragment: RFC 3986's unreserved and reserved
# characters and "%" (escapes already made), less the single quote. Everything else
# (quotes, angle brackets, spaces, backticks, braces, non-ASCII) is percent-encoded, so a
# stored URL is never markup in an HTML attribute, quoted either way.
_URL_SAFE = "-._~:/?#[]@!$&()*+,;=%"
# A URL of only such characters (and letters and digits): ``quote`` leaves it as it is.
_QUOTED = re.compile(r"[A-Za-z0-9_\-.~:/?#\[\]@!$&()*+,;=%]*\Z")


# A pure function of its text, and hosts repeat from item to item (a feed's items share
# its host): remembered, it costs a dict lookup instead of an IP and IDNA parse per URL,
# which was a tenth of the processor's CPU per row (bench/RESULTS.md).
@functools.lru_cache(maxsize=4096)
def canonical_host(hostname: str) -> str | None:
    """A host as one spelling: an IP address in its standard form (``127.1``,
    ``2130706433`` and ``0x7f.1`` are all ``127.0.0.1``, as the resolver reads them), a
    DNS name lower-cased and IDNA-encoded, no trailing dot; None when it is neither (a
    quote, an angle bracket, an empty or over-long label)."""
    host = hostname.strip().lower().rstrip(".")
    if not host:
        return None
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
                return str(address.ipv4_mapped)
            return f"[{address.compressed}]"
        return str(address)
    if _NUMERIC.match(host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host))  # the resolver's own reading
        except OSError:
            pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return None
    labels = ascii_host.split(".")
    if len(ascii_host) > 253 or not all(_LABEL.match(label) for label in labels):
        return None
    return ascii_host


def joined_link(link: str, base: str) -> str:
    """A feed's link as an absolute http(s) URL: resolved against ``base`` (the feed's
    URL) when relative, or "" for none: javascript:, data:, mailto: ... never become a
    listing's or a site's link."""
    absolute = urljoin(base, link) if link else ""
    return absolute if urlsplit(absolute).scheme in ("http", "https") else ""


def web_urls(value: object) -> tuple[str, str] | None:
    """``value`` as an absolute http(s) URL fit to store and send, and its
    ``canonical_url``, from one parse (the processor's hot path); None when it is not one.

    It has a real host (``canonical_host``) and a port in range; user info is dropped
    (a listing's link never needs a password); the path, query and fragment keep their
    meaning with every character outside ``_URL_SAFE`` percent-encoded.
    tests/test_properties.py checks the canonical URL agrees with ``canonical_url``.
    """
    if not isinstance(value, str):
        return None
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:  # a port out of range, a malformed IPv6 literal
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    host = canonical_host(parts.hostname)
    if host is None:
        return None
    netloc = host if port is None else f"{host}:{port}"
    path, query, fragment = parts.path, parts.query, parts.fragment
    if not _QUOTED.match(value):  # most links need no escape: three quotes saved
        path, query, fragment = (quote(part, safe=_URL_SAFE) for part in (path, query, fragment))
    web = urlunsplit((scheme, netloc, path or "/", query, fragment))
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        host = f"{host}:{port}"
    canonical = urlunsplit((scheme, host, _upper_escapes(path) or "/", _upper_escapes(query), ""))
    return web, canonical


def _upper_escapes(text: str) -> str:
    return _ESCAPE.sub(lambda m: m.group(0).upper(), text) if "%" in text else text


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
    host = canonical_host(parts.hostname or "")
    if not scheme or not host:
        return value
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (f"{userinfo}@" if userinfo else "") + host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc += f":{port}"
    return urlunsplit((scheme, netloc, _upper_escapes(parts.path) or "/", _upper_escapes(parts.query), ""))


def item_key(url: str, source_item_id: str, *, canonical: bool = False, source_url: str | None = None) -> str:
    """The identity of an item for "a user hears about it once": its canonical URL with
    its feed id (guid, Atom id, or what stands in for one). The same entry reached
    through two sources of one site (two spellings of a feed, feeds that redirect to
    one) has one key; two entries that share a link but not an id (a page watched for
    changes, a feed linking every item to its home page) have two. ``canonical``: the
    URL is already in its canonical spelling (``web_urls``).

    An item whose link is on another site than its source's (``source_url``;
    ``offsite``) is keyed within its source's site: a page on B listing A's link first
    took the key of A's own item, and A's item was never told (the user's one alert per
    key went to B's copy, B's text). Copies of one story on other sites are one alert
    by their story (pipeline/listings/stories.py), which an off-site item cannot begin
    for its link's own site."""
    link = url if canonical else canonical_url(url)
    scope = f"\n{source_site(source_url)}" if source_url is not None and offsite(link, source_url, canonical=True) else ""
    text = f"{link}\n{source_item_id}{scope}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def offsite(url: str | None, source_url: str | None, *, canonical: bool = False) -> bool:
    """Whether an item's link ``url`` is on another site (registrable domain) than its
    source's: an aggregator's item, or a hostile source's linking a real article.
    ``canonical``: ``url`` is in its canonical spelling (``web_urls``), read without a parse."""
    if source_url is None or not url:
        return False
    site = canonical_site(url) if canonical else url_site(url)
    return not (site and site == source_site(source_url))


@functools.lru_cache(maxsize=4096)
def source_site(source_url: str) -> str:
    """``url_site`` of a source's URL, remembered: every item of a source asks it."""
    return url_site(source_url)


# Query parameters that say how a reader arrived, not what they read: campaign tags
# (``utm_*``) and the click ids that ad networks, mail tools and social sites append.
# Two sources linking one story differ in these and nothing else.
TRACKING_PREFIXES = ("utm_",)
TRACKING_PARAMETERS = frozenset({
    "fbclid", "gclid", "dclid", "gbraid", "wbraid", "msclkid", "yclid", "twclid", "ttclid",
    "igshid", "mc_cid", "mc_eid", "_hsenc", "_hsmi", "mkt_tok", "oly_anon_id", "oly_enc_id",
    "vero_id", "_ga", "_gl",
})


def story_url(canonical: str) -> str | None:
    """The address of the story a canonical URL (``web_urls``) shows, for "the same story
    from different sources": the URL without tracking parameters (the rest of the query
    kept as written, in order). None for a site's home page (path ``/``, no query left):
    feeds that link every item to their home page say nothing about which story it is."""
    if "?" not in canonical:  # no query, nothing to take out: most links, without a parse
        path = canonical[canonical.find("/", canonical.find("//") + 2):]
        return None if path == "/" else canonical
    return _story_url_parsed(canonical)


def _story_url_parsed(canonical: str) -> str | None:
    """``story_url`` by parsing the URL (any URL: with a query or without)."""
    parts = urlsplit(without_tracking(canonical))
    if parts.path == "/" and not parts.query:
        return None
    return urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))


def without_tracking(url: str) -> str:
    """``url`` without its tracking parameters (``utm_*``, ``fbclid``, ...), the rest of
    its query kept as written, in order: the one rule for a story's link and for a
    source's URL (``source_url``)."""
    if "?" not in url:
        return url
    parts = urlsplit(url)
    kept = [pair for pair in parts.query.split("&") if pair and not _is_tracking(unquote(pair.partition("=")[0]).lower())]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), parts.fragment))


def source_url(url: str) -> str:
    """A source's URL as it is stored and compared: canonical, without tracking
    parameters (``.../jobs.rss?utm_campaign=x`` is ``.../jobs.rss``: one feed, one
    source). Items' links keep theirs in ``canonical_url``: their keys never change."""
    return without_tracking(canonical_url(url))


def _is_tracking(name: str) -> bool:
    return name.startswith(TRACKING_PREFIXES) or name in TRACKING_PARAMETERS


@functools.cache
def _suffixes() -> tldextract.TLDExtract:
    # The snapshot of the Public Suffix List that ships with tldextract: no download.
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@functools.lru_cache(maxsize=4096)
def registrable_domain(host: str) -> str:
    """``host``'s registrable domain (``a.blog.example.co.uk`` is ``example.co.uk``, by the
    Public Suffix List); an IP address or a bare suffix is its own."""
    parts = _suffixes()(host)
    return parts.top_domain_under_public_suffix or host


def url_host(url: str) -> str:
    """``url``'s host in its one spelling (``canonical_host``: ``127.1`` and ``127.0.0.1``
    are one machine), an IPv6 literal without its brackets; "" when it has no usable
    host or cannot be parsed."""
    try:
        host = canonical_host(urlsplit(url).hostname or "")
    except ValueError:  # a malformed IPv6 literal
        return ""
    return host.strip("[]") if host else ""


# Remembered: a source's URL is asked with every new listing of it (stories.py).
@functools.lru_cache(maxsize=4096)
def url_site(url: str) -> str:
    """The registrable domain of ``url``'s host; "" when it has no usable host."""
    host = url_host(url)
    return registrable_domain(host) if host else ""


def canonical_site(canonical: str) -> str:
    """``url_site`` of a canonical URL (``web_urls``), read off its text without a parse:
    its host is already canonical, with no user, and a port only after it."""
    start = canonical.find("//") + 2
    end = canonical.find("/", start)
    host = canonical[start:] if end < 0 else canonical[start:end]
    host = host[1:host.find("]")] if host.startswith("[") else host.partition(":")[0]
    return registrable_domain(host) if host else ""

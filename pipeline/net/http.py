"""Fetching a URL, for feeds, pages and webhooks alike;
every failure is a ``FetchError`` with a code of the taxonomy.

httpx's transport (a kept-alive connection pool per thread), an SSRF guard on the address
actually connected to, a streamed size cap, an overall deadline, conditional GET,
bounded redirects and Retry-After.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from pipeline.core.errors import BlockedAddress, FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.settings import Settings

# httpx logs every request's full URL at INFO ("HTTP Request: POST https://..."). URLs can
# be credentials (a chat service's webhook carries its token in the path), and the
# pipeline records each fetch in its own telemetry, without them: keep httpx to warnings.
logging.getLogger("httpx").setLevel(logging.WARNING)

try:
    _VERSION = version("listings-pipeline")
except PackageNotFoundError:  # running from a checkout that is not installed
    _VERSION = "dev"
USER_AGENT = f"listings-pipeline/{_VERSION} (feed and page fetcher; python-httpx)"
REDIRECTS = (301, 302, 303, 307, 308)
PERMANENT_REDIRECTS = (301, 308)
# How much of an error response is kept (FetchError.body): enough for an API's JSON error
# (the YouTube adapter reads its reason), and it lets the connection go back to the pool.
ERROR_BODY_BYTES = 64 * 1024
# The content codings asked for and decoded (by this module, under the size cap). Brotli
# and zstd are not asked for: decoding them incrementally under a cap needs libraries
# this project does not depend on.
ACCEPT_ENCODING = "gzip, deflate"
# At most this much decoded output per step: a compressed chunk never inflates in one go.
INFLATE_STEP = 64 * 1024
# A Retry-After in seconds past this is read as this (about 31 years): far past every
# backoff cap (which then applies), and far from timedelta's limits.
RETRY_AFTER_MAX_SECONDS = 10**9
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressGuard:
    """Refuses loopback, private, link-local, reserved, multicast and unspecified
    addresses, except those inside the allow-list (PIPELINE_ALLOW_NETWORKS)."""

    def __init__(self, allow_networks: Iterable[str] = ()) -> None:
        try:
            self.allowed = [ipaddress.ip_network(n.strip(), strict=False) for n in allow_networks]
        except ValueError as exc:
            raise ValueError(f"PIPELINE_ALLOW_NETWORKS: {exc}") from None

    def refuses(self, address: IPAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address):
            embedded = _embedded_ipv4(address)
            if embedded is not None:
                address = embedded  # ::ffff:127.0.0.1 is 127.0.0.1; so are 6to4 and NAT64 forms of it
            elif address.is_site_local:
                return True  # fec0::/10: deprecated, still private, yet "global" to ipaddress
        if any(address in network for network in self.allowed):
            return False
        return not address.is_global or address.is_multicast or address.is_reserved

    def refused_host(self, host: str) -> list[str]:
        """The addresses ``host`` (a name or an IP literal) stands for, when this guard
        refuses every one: a channel that could never be sent to, told when it is added.
        Empty when one is allowed, or when a name does not resolve now (it is checked
        again, hop by hop, at each send)."""
        try:
            addresses = [ipaddress.ip_address(host.strip("[]").split("%", 1)[0])]
        except ValueError:
            try:
                infos = _real_getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except (OSError, UnicodeError):
                return []
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        refused = [str(a) for a in dict.fromkeys(addresses) if self.refuses(a)]
        return refused if len(refused) == len(dict.fromkeys(addresses)) else []


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for: IPv4-mapped, 6to4 or NAT64's well-known
    prefix (each reaches that IPv4 address through a gateway or the host's own stack)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


_exchange = threading.local()


@contextmanager
def _deadline(at: float) -> Iterator[None]:
    """Every socket operation of this thread's exchange ends by ``at`` (time.monotonic()).

    httpx's timeouts bound each read on its own, so a server that sends one header line a
    second, or ``100 Continue`` after ``100 Continue``, is never idle long enough to trip
    them; the exchange's deadline is checked at every read, write and connect instead.
    """
    _exchange.deadline = at
    try:
        yield
    finally:
        _exchange.deadline = None


def _within_deadline(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` shortened to what is left of the exchange's deadline; ``error`` once
    nothing is left."""
    at: float | None = getattr(_exchange, "deadline", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the exchange's deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write is bounded by the exchange's deadline, and
    which counts its reads since its last write."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        # Reads since the last write: a response parsed with none was on the connection
        # before its request was sent (see Fetcher._open).
        self.reads_since_write = 0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.reads_since_write += 1
        return self._stream.read(max_bytes, _within_deadline(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.reads_since_write = 0
        self._stream.write(buffer, _within_deadline(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        timeout = _within_deadline(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


# -- guarding a library's own sockets ------------------------------------------------
#
# Apprise does its own networking (requests, smtplib, raw sockets for IRC or syslog), so
# it cannot use the guarded transport below. Inside ``guarded_sockets``, in this thread,
# two layers hold: the lookup (socket.getaddrinfo) hands back only the addresses the guard
# allows, so a connection by name, every redirect hop included, goes to a vetted address
# (no window for DNS rebinding either); and the socket itself (connect, connect_ex,
# sendto) refuses an address the guard refuses, for a transport that connects to an
# address it never looked up (an IP literal reaches C without a Python lookup: an IRC
# channel connected to loopback, a syslog one sent it a datagram). Outside the block, and
# in every other thread, both are untouched.

_library = threading.local()
_install_lock = threading.Lock()
_real_getaddrinfo = socket.getaddrinfo


def _vetted_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    infos = _real_getaddrinfo(host, port, *args, **kwargs)
    guard: AddressGuard | None = getattr(_library, "guard", None)
    if guard is None:
        return infos
    allowed, refused = [], []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])  # no IPv6 zone
        if guard.refuses(address):
            refused.append(str(address))
        else:
            allowed.append(info)
    _library.refused.extend(refused)
    if not allowed:
        raise socket.gaierror(socket.EAI_NONAME, f"{host} resolves only to refused addresses: {', '.join(refused)}")
    return allowed


_real_connect, _real_connect_ex, _real_sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto


def _vetted_address(sock: socket.socket, address: Any) -> Any:
    """``address`` as this thread's guard lets a socket use it: an IP address it refuses
    raises OSError (and is recorded), a name is resolved here through the vetted lookup
    (connect and sendto would resolve it in C, unvetted) and its first allowed address
    used; a Unix socket's path, and any address outside the block, pass as they are."""
    guard: AddressGuard | None = getattr(_library, "guard", None)
    if guard is None or sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
        return address
    try:
        ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
    except ValueError:  # a name
        return _vetted_getaddrinfo(address[0], address[1], sock.family, sock.type)[0][4]
    if guard.refuses(ip):
        _library.refused.append(str(ip))
        raise OSError(errno.EACCES, f"the address guard refuses {ip}")
    return address


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _real_connect(self, _vetted_address(self, address))


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    return int(_real_connect_ex(self, _vetted_address(self, address)))


def _guarded_sendto(self: socket.socket, data: Any, *args: Any) -> int:
    # sendto(data, address) or sendto(data, flags, address)
    return int(_real_sendto(self, data, *args[:-1], _vetted_address(self, args[-1])))  # type: ignore[call-overload]


@contextmanager
def guarded_sockets(guard: AddressGuard) -> Iterator[list[str]]:
    """Within the block, this thread's new connections and datagrams go to addresses
    ``guard`` allows only; yields the list of the refused addresses it was asked for,
    filled as it goes."""
    with _install_lock:
        if socket.getaddrinfo is not _vetted_getaddrinfo:
            socket.getaddrinfo = _vetted_getaddrinfo
            socket.socket.connect = _guarded_connect  # type: ignore[method-assign, assignment]
            socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign, assignment]
            socket.socket.sendto = _guarded_sendto  # type: ignore[method-assign, assignment]
    refused: list[str] = []
    _library.guard, _library.refused = guard, refused
    try:
        yield refused
    finally:
        _library.guard = None


class _GuardedBackend(httpcore.SyncBackend):
    """Resolves the host itself, vets every address, and connects to a vetted one.

    Checking the address that is connected to (not a separate lookup before the
    request) leaves no window for DNS rebinding; TLS still verifies the host name.
    """

    def __init__(self, guard: AddressGuard) -> None:
        self.guard = guard

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        refused = []
        last_error: Exception | None = None
        for *_, sockaddr in infos:
            address = ipaddress.ip_address(sockaddr[0])
            if self.guard.refuses(address):
                refused.append(str(address))
                continue
            try:
                return _DeadlineStream(super().connect_tcp(
                    str(address), port, _within_deadline(timeout, httpcore.ConnectTimeout),
                    local_address, socket_options,
                ))
            except httpcore.ConnectError as exc:
                last_error = exc
        if last_error is not None:
            raise last_error
        raise BlockedAddress(f"{host} resolves only to refused addresses: {', '.join(refused)}")


class _GuardedTransport(httpx.HTTPTransport):
    def __init__(self, guard: AddressGuard, limits: httpx.Limits, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, limits=limits, trust_env=False)
        # httpx does not expose httpcore's network_backend: rebuild its pool with ours.
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedBackend(guard),
        )


@dataclass(frozen=True)
class FetchResult:
    url: str  # the URL finally answered
    status: int  # 200..299, or 304 (not modified: no body)
    body: bytes
    content_type: str | None
    etag: str | None
    last_modified: str | None
    moved_to: str | None  # the new URL when the chain began with permanent redirects
    # Content-Location, made absolute: the base for relative links in the body.
    content_location: str | None = None
    # How long the response says it stays fresh (Cache-Control max-age, else Expires).
    fresh_seconds: float | None = None
    # Its Link header's targets by relation, made absolute ({"hub": ..., "self": ...}).
    links: Mapping[str, str] = field(default_factory=dict)

    @property
    def not_modified(self) -> bool:
        return self.status == 304


_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)\"?\s*(?:,|$)", re.IGNORECASE)
_NO_FRESHNESS = re.compile(r"(?:^|,)\s*(?:no-cache|no-store)\s*(?:[=,]|$)", re.IGNORECASE)


def fresh_for(headers: Mapping[str, str], now: datetime) -> float | None:
    """Seconds the response says it stays fresh (RFC 9111 4.2.1: ``Cache-Control:
    max-age``, else ``Expires`` less ``Date``, else less ``now``); None when it says
    nothing, or ``no-cache`` / ``no-store``, or a freshness of 0."""
    control = headers.get("cache-control") or ""  # httpx joins repeated headers with ","
    if _NO_FRESHNESS.search(control):
        return None
    if (found := _MAX_AGE.search(control)) is not None:
        return float(found.group(1)) or None
    expires = _http_date(headers.get("expires"))
    if expires is None:
        return None
    seconds = (expires - (_http_date(headers.get("date")) or now)).total_seconds()
    return seconds if seconds > 0 else None


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """Retry-After as an absolute time: delta-seconds or an HTTP date; None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return now + timedelta(seconds=min(int(value), RETRY_AFTER_MAX_SECONDS))
    return _http_date(value)


class Fetcher:
    """One per run: kept-alive connections, a pool per thread; at most ``per_host``
    webhook posts at once per host.

    Feed and page fetches are not limited here: the collector's claim hands out a source
    only when its politeness group has room (pipeline/fetching/politeness.py), across workers.
    """

    def __init__(
        self,
        *,
        timeout: float = 20.0,
        max_bytes: int = 15 * 1024 * 1024,
        allow_networks: Iterable[str] = (),
        max_redirects: int = 5,
        per_host: int = 2,
        max_connections: int = 32,
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self.per_host = per_host
        self._host_slots: dict[str, threading.BoundedSemaphore] = {}
        self._slots_lock = threading.Lock()
        # Per thread: one request at a time, a few hosts' connections kept alive.
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=4)
        self.guard = AddressGuard(allow_networks)
        self._ssl_context = tls_context()
        # Requests go to httpx's transport itself, not through an ``httpx.Client``: what a
        # client adds (a cookie jar, auth and redirect handling, environment proxies) is
        # either unwanted here or done by hand (redirects, so each hop is counted and
        # vetted), and cost about a third of a 304's HTTP work (bench/RESULTS.md). No
        # cookie is kept, so one a site sets never reaches another; no environment proxy
        # is used, which would bypass the address guard.
        self._headers = {
            "Accept": "*/*", "Accept-Encoding": ACCEPT_ENCODING, "Connection": "keep-alive",
            "User-Agent": USER_AGENT,
        }
        self._timeouts = httpx.Timeout(timeout, connect=min(timeout, 10.0)).as_dict()
        self._local = threading.local()
        self._transports: list[_GuardedTransport] = []

    @property
    def transport(self) -> httpx.HTTPTransport:
        """This thread's transport: each thread has its own connection pool, since
        httpcore's pool scans every connection it holds on each request and each release."""
        transport: _GuardedTransport | None = getattr(self._local, "transport", None)
        if transport is None:
            transport = self._local.transport = _GuardedTransport(self.guard, self._limits, self._ssl_context)
            with self._slots_lock:
                self._transports.append(transport)
        return transport

    @classmethod
    def from_settings(cls, settings: Settings, *, threads: int = 16) -> Fetcher:
        """The run's Fetcher as the settings configure it. (``threads`` sizes each
        thread's pool bound as it once sized the shared one: more than a thread, with
        one request at a time, ever opens.)"""
        return cls(
            timeout=settings.http_timeout_seconds,
            max_bytes=settings.max_response_bytes,
            allow_networks=settings.allow_networks,
            max_connections=max(threads * 2, 8),
        )

    def close(self) -> None:
        with self._slots_lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.close()

    def __enter__(self) -> Fetcher:  # noqa: PYI034 (Fetcher is not meant to be subclassed)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _host_slot(self, url: str) -> Iterator[None]:
        host = (urlsplit(url).hostname or "").lower()
        with self._slots_lock:
            slot = self._host_slots.setdefault(host, threading.BoundedSemaphore(self.per_host))
        with slot:
            yield

    def fetch(
        self,
        url: str,
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> FetchResult:
        """GET ``url`` following at most ``max_redirects`` redirects; FetchError on failure.

        ``headers`` (an API key, say) are sent to ``url``'s origin only: a redirect to
        another origin drops them, as browsers drop credentials.
        """
        started = time.monotonic()
        deadline = started + self.timeout
        sent: dict[str, str] = dict(headers or {})
        if etag:
            sent["If-None-Match"] = etag
        if last_modified:
            sent["If-Modified-Since"] = last_modified
        with _deadline(deadline):
            return self._fetch(url, headers, sent, deadline)

    def _fetch(
        self, url: str, headers: Mapping[str, str] | None, sent: dict[str, str], deadline: float,
    ) -> FetchResult:
        origin = _origin(url)
        moved_to: str | None = None
        permanent_so_far = True
        current = url
        for _hop in range(self.max_redirects + 1):
            response = self._open(current, sent, deadline)
            try:
                if response.status_code in REDIRECTS:
                    target = self._redirect_target(current, response)
                    permanent_so_far = permanent_so_far and response.status_code in PERMANENT_REDIRECTS
                    if permanent_so_far:
                        moved_to = target
                    if headers and _origin(target) != origin:
                        sent = {k: v for k, v in sent.items() if k not in headers}
                    self._drain(response, deadline)
                    current = target
                    continue
                body = self._body(response, deadline)
            finally:
                response.close()
            return FetchResult(
                url=current,
                status=response.status_code,
                body=body,
                content_type=response.headers.get("content-type"),
                content_location=(
                    urljoin(current, response.headers["content-location"])
                    if response.headers.get("content-location") else None
                ),
                etag=response.headers.get("etag"),
                last_modified=response.headers.get("last-modified"),
                links={rel: urljoin(current, link["url"]) for rel, link in response.links.items()
                       if isinstance(rel, str) and link.get("url")},
                moved_to=moved_to,
                fresh_seconds=fresh_for(response.headers, datetime.now(UTC)),
            )
        raise FetchError(
            FailureReason.HTTP_4XX,
            f"more than {self.max_redirects} redirects starting at {url}",
        )

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        """POST ``body`` to ``url`` (a webhook); the 2xx status, or FetchError.

        The guard, the timeouts and the deadline apply as for ``fetch``. Redirects are
        not followed: a receiver that redirects is misconfigured, and following would
        send a signed body somewhere its owner did not name.
        """
        with self._host_slot(url):
            # The deadline starts once the request can be sent: waiting for the host's
            # slot is never a timeout.
            deadline = time.monotonic() + self.timeout
            with _deadline(deadline):
                return self._post(url, body, headers, deadline)

    def _post(self, url: str, body: bytes, headers: Mapping[str, str], deadline: float) -> int:
        response = self._open(url, dict(headers), deadline, method="POST", content=body)
        try:
            excerpt = self._drain(response, deadline)
            if 200 <= response.status_code < 300:
                return response.status_code
            if response.status_code in REDIRECTS:
                raise FetchError(
                    FailureReason.HTTP_4XX,
                    f"the receiver redirected ({response.status_code}); redirects are not followed",
                    http_status=response.status_code,
                )
            raise _status_error(response, excerpt)
        finally:
            response.close()

    def _body(self, response: httpx.Response, deadline: float) -> bytes:
        """The body of a final response, or FetchError for a status that is a failure.

        Every response is read to its end (a 304's empty body too): httpcore only returns
        a connection to the pool once its response was read, so this keeps keep-alive.
        """
        status = response.status_code
        if status == 304:
            self._drain(response, deadline)
            return b""
        if 200 <= status < 300:
            return self._read_capped(response, deadline)
        excerpt = self._drain(response, deadline)
        raise _status_error(response, excerpt)

    def _drain(self, response: httpx.Response, deadline: float) -> bytes:
        """Read up to ERROR_BODY_BYTES of a response whose body is not the point."""
        try:
            return self._read_capped(response, deadline, limit=ERROR_BODY_BYTES, truncate=True)
        except FetchError:
            return b""  # the status says what matters; the connection is simply closed

    def _open(
        self, url: str, headers: dict[str, str], deadline: float, *, method: str = "GET",
        content: bytes | None = None,
    ) -> httpx.Response:
        """Send the request, streamed; FetchError (with the taxonomy's code) when no
        answer comes, or when ``deadline`` has already passed."""
        if time.monotonic() >= deadline:
            raise FetchError(FailureReason.TIMEOUT, f"no answer within {self.timeout:g} s")
        for attempt in (1, 2):
            try:
                sent = httpx.Headers(self._headers)
                sent.update(headers)  # by name, whatever its case
                request = httpx.Request(method, url, headers=sent, content=content,
                                        extensions={"timeout": self._timeouts})
                response = self.transport.handle_request(request)
                response.request = request
            except (BlockedAddress, httpx.HTTPError, httpx.InvalidURL) as exc:
                raise _request_error(exc, url, self.timeout) from None
            stream = response.extensions.get("network_stream")
            if not isinstance(stream, _DeadlineStream) or stream.reads_since_write:
                return response
            # The answer was on the connection before the request was sent: the previous
            # response on it ran past its Content-Length, and what followed would pass
            # for this one's. Closed unread, the connection leaves the pool; a GET is
            # asked again on a fresh one, a POST (which the server may have read) is not.
            response.close()
            if method != "GET" or attempt == 2:
                break
        raise FetchError(
            FailureReason.NETWORK_ERROR,
            "the connection held an answer before the request was sent"
            " (an earlier response ran past its length); it was closed",
        )

    @staticmethod
    def _redirect_target(current: str, response: httpx.Response) -> str:
        location = response.headers.get("location")
        if not location:
            raise FetchError(
                FailureReason.HTTP_4XX, f"{response.status_code} redirect without a Location",
                http_status=response.status_code,
            )
        target: str = urljoin(current, location)
        if urlsplit(target).scheme not in ("http", "https"):
            raise FetchError(
                FailureReason.BLOCKED_ADDRESS, f"redirect to a non-http(s) URL {target!r}",
                http_status=response.status_code,
            )
        return target

    def _read_capped(
        self, response: httpx.Response, deadline: float, *, limit: int | None = None,
        truncate: bool = False,
    ) -> bytes:
        """The body, up to ``limit`` bytes (default the size cap): past it, FetchError
        (too_large), or with ``truncate`` the first ``limit`` bytes."""
        cap = self.max_bytes if limit is None else limit
        declared = response.headers.get("content-length")
        if not truncate and declared and declared.isdigit() and int(declared) > cap:
            raise FetchError(
                FailureReason.TOO_LARGE,
                f"Content-Length {declared} is over the {cap} byte cap",
                http_status=response.status_code,
            )
        inflate = _decoder(response)
        chunks, size = [], 0
        try:
            # Decoded bytes are counted, INFLATE_STEP at a time, so a small compression
            # bomb is stopped at the cap and never inflated whole in memory.
            for raw in response.iter_raw():
                for chunk in inflate(raw):
                    size += len(chunk)
                    if size > cap:
                        if truncate:
                            chunks.append(chunk[: cap - (size - len(chunk))])
                            return b"".join(chunks)
                        raise FetchError(
                            FailureReason.TOO_LARGE,
                            f"body over the {cap} byte cap",
                            http_status=response.status_code,
                        )
                    chunks.append(chunk)
        except httpx.TimeoutException:
            # Also a server that drips bytes past the deadline: every read is bounded by it
            # (_DeadlineStream).
            raise FetchError(FailureReason.TIMEOUT, f"body not complete within {self.timeout:g} s") from None
        except zlib.error as exc:
            raise FetchError(FailureReason.PARSE_ERROR, f"undecodable body: {exc}") from None
        except httpx.TransportError as exc:
            raise FetchError(FailureReason.NETWORK_ERROR, f"{type(exc).__name__}: {exc}") from None
        return b"".join(chunks)


class _Inflater:
    """One content coding undone in steps of at most INFLATE_STEP bytes of output."""

    def __init__(self, coding: str) -> None:
        self.deflate = coding == "deflate"
        # gzip: a gzip header; deflate: a zlib stream, or (as some servers send) a raw one.
        self._d = zlib.decompressobj(zlib.MAX_WBITS if self.deflate else 16 + zlib.MAX_WBITS)
        self._started = False

    def __call__(self, raw: bytes) -> Iterator[bytes]:
        while True:
            try:
                out = self._d.decompress(raw, INFLATE_STEP)
            except zlib.error:
                if not self.deflate or self._started:
                    raise
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, no zlib header
                self._started = True
                continue
            self._started = True
            if out:
                yield out
            if self._d.eof:
                raw = self._d.unused_data
                if not raw or self.deflate:
                    return
                self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next gzip member
                continue
            raw = self._d.unconsumed_tail
            if not raw and len(out) < INFLATE_STEP:  # a full step may leave output pending
                return


def _decoder(response: httpx.Response) -> Callable[[bytes], Iterable[bytes]]:
    """The body's content coding, undone under the cap (see ``_Inflater``).

    Only what ACCEPT_ENCODING asks for is decoded, one layer of it: a layered coding
    (``gzip, gzip``, which inflates by a factor of a million) or an unknown one is refused.
    """
    header = response.headers.get("content-encoding", "")
    codings = [c for c in (part.strip().lower() for part in header.split(",")) if c and c != "identity"]
    if not codings:
        return lambda raw: (raw,)
    if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
        raise FetchError(
            FailureReason.PARSE_ERROR,
            f"Content-Encoding {header!r} is not accepted (one layer of {ACCEPT_ENCODING})",
            http_status=response.status_code,
        )
    return _Inflater(codings[0])


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context every Fetcher shares: loading the CA bundle costs 16 ms
    of CPU, and a Fetcher is made per pass of a stage (a collector or notifier pass that
    finds nothing spent it too: most of the collector's CPU per fetch in the soak's
    lulls, bench/RESULTS.md). A context is safe to share between threads and
    connections; nothing here changes it after it is made."""
    return httpx.create_ssl_context(trust_env=False)


def _request_error(exc: Exception, url: str, timeout: float) -> FetchError:
    """The taxonomy's code for a request that got no answer."""
    if isinstance(exc, BlockedAddress):
        return FetchError(FailureReason.BLOCKED_ADDRESS, str(exc))
    if isinstance(exc, httpx.TimeoutException):
        return FetchError(FailureReason.TIMEOUT, f"no answer within {timeout:g} s")
    if isinstance(exc, httpx.InvalidURL):
        return FetchError(FailureReason.INVALID_CONFIG, f"invalid URL {url!r}: {exc}")
    return FetchError(FailureReason.NETWORK_ERROR, f"{type(exc).__name__}: {exc}")


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def _status_error(response: httpx.Response, body: bytes) -> FetchError:
    """The taxonomy's code for a final status that is not a success."""
    status = response.status_code
    retry_after = parse_retry_after(response.headers.get("retry-after"), datetime.now(UTC))
    if status == 429:
        reason = FailureReason.RATE_LIMITED
    elif status >= 500:
        reason = FailureReason.HTTP_5XX
    elif status >= 400:
        reason = FailureReason.HTTP_4XX
    else:  # 1xx, or a 3xx that is not a redirect
        return FetchError(FailureReason.HTTP_4XX, f"unexpected status {status}", http_status=status)
    return FetchError(
        reason, f"HTTP {status} {response.reason_phrase}".strip(),
        http_status=status, retry_after=retry_after, body=body,
    )

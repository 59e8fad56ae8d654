"""Fetching a URL the way DESIGN.md ("HTTP") asks: one httpx client per run, an SSRF guard
on the address actually connected to, a streamed size cap, an overall deadline,
conditional GET, bounded redirects and Retry-After. Failures are ``FetchError``s.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from pipeline.failures import FailureReason, FetchError

try:
    _VERSION = version("listings-pipeline")
except PackageNotFoundError:  # running from a checkout that is not installed
    _VERSION = "dev"
USER_AGENT = f"listings-pipeline/{_VERSION} (feed and page fetcher; python-httpx)"
REDIRECTS = (301, 302, 303, 307, 308)
PERMANENT_REDIRECTS = (301, 308)
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class BlockedAddress(Exception):
    """Raised where the socket would be opened; deliberately not an OSError, so httpcore
    passes it through instead of calling it a connection failure."""


class AddressGuard:
    """Refuses loopback, private, link-local, reserved, multicast and unspecified
    addresses, except those inside the allow-list (PIPELINE_ALLOW_NETWORKS)."""

    def __init__(self, allow_networks: Iterable[str] = ()) -> None:
        try:
            self.allowed = [ipaddress.ip_network(n.strip(), strict=False) for n in allow_networks]
        except ValueError as exc:
            raise ValueError(f"PIPELINE_ALLOW_NETWORKS: {exc}") from None

    def refuses(self, address: IPAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
        if any(address in network for network in self.allowed):
            return False
        return not address.is_global or address.is_multicast or address.is_reserved


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
                return super().connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                last_error = exc
        if last_error is not None:
            raise last_error
        raise BlockedAddress(f"{host} resolves only to refused addresses: {', '.join(refused)}")


class _GuardedTransport(httpx.HTTPTransport):
    def __init__(self, guard: AddressGuard, limits: httpx.Limits) -> None:
        super().__init__(limits=limits, trust_env=False)
        # httpx does not expose httpcore's network_backend: rebuild its pool with ours.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
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
    elapsed_ms: int

    @property
    def not_modified(self) -> bool:
        return self.status == 304


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """Retry-After as an absolute time: delta-seconds or an HTTP date; None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return now + timedelta(seconds=int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class Fetcher:
    """One per run: pooled connections, at most ``per_host`` requests at once per host."""

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
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self.client = httpx.Client(
            transport=_GuardedTransport(AddressGuard(allow_networks), limits),
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            headers={"User-Agent": USER_AGENT},
            follow_redirects=False,  # followed by hand, so each hop is counted and vetted
            trust_env=False,  # an environment proxy would bypass the address guard
        )

    def close(self) -> None:
        self.client.close()

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
        self, url: str, *, etag: str | None = None, last_modified: str | None = None
    ) -> FetchResult:
        """GET ``url`` following at most ``max_redirects`` redirects; FetchError on failure."""
        started = time.monotonic()
        deadline = started + self.timeout
        headers = {}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        moved_to: str | None = None
        permanent_so_far = True
        current = url
        for _hop in range(self.max_redirects + 1):
            with self._host_slot(current):
                response = self._open(current, headers, deadline)
                try:
                    if response.status_code in REDIRECTS:
                        target = self._redirect_target(current, response)
                        permanent_so_far = permanent_so_far and response.status_code in PERMANENT_REDIRECTS
                        if permanent_so_far:
                            moved_to = target
                        current = target
                        continue
                    self._raise_for_status(response)
                    body = b"" if response.status_code == 304 else self._read_capped(response, deadline)
                finally:
                    response.close()
            return FetchResult(
                url=current,
                status=response.status_code,
                body=body,
                content_type=response.headers.get("content-type"),
                etag=response.headers.get("etag"),
                last_modified=response.headers.get("last-modified"),
                moved_to=moved_to,
                elapsed_ms=int((time.monotonic() - started) * 1000),
            )
        raise FetchError(
            FailureReason.HTTP_4XX,
            f"more than {self.max_redirects} redirects starting at {url}",
        )

    def _open(self, url: str, headers: dict[str, str], deadline: float) -> httpx.Response:
        if time.monotonic() >= deadline:
            raise FetchError(FailureReason.TIMEOUT, f"no answer within {self.timeout:g} s")
        try:
            request = self.client.build_request("GET", url, headers=headers)
            return self.client.send(request, stream=True)
        except BlockedAddress as exc:
            raise FetchError(FailureReason.BLOCKED_ADDRESS, str(exc)) from None
        except httpx.TimeoutException:
            raise FetchError(FailureReason.TIMEOUT, f"no answer within {self.timeout:g} s") from None
        except httpx.InvalidURL as exc:
            raise FetchError(FailureReason.INVALID_CONFIG, f"invalid URL {url!r}: {exc}") from None
        except (httpx.TransportError, httpx.UnsupportedProtocol) as exc:
            raise FetchError(FailureReason.NETWORK_ERROR, f"{type(exc).__name__}: {exc}") from None

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

    @staticmethod
    def _raise_for_status(response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            if status == 304 or 200 <= status < 300:
                return
            raise FetchError(FailureReason.HTTP_4XX, f"unexpected status {status}", http_status=status)
        retry_after = parse_retry_after(response.headers.get("retry-after"), datetime.now(UTC))
        if status == 429:
            reason = FailureReason.RATE_LIMITED
        elif status >= 500:
            reason = FailureReason.HTTP_5XX
        else:
            reason = FailureReason.HTTP_4XX
        raise FetchError(
            reason, f"HTTP {status} {response.reason_phrase}".strip(),
            http_status=status, retry_after=retry_after,
        )

    def _read_capped(self, response: httpx.Response, deadline: float) -> bytes:
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise FetchError(
                FailureReason.TOO_LARGE,
                f"Content-Length {declared} is over the {self.max_bytes} byte cap",
                http_status=response.status_code,
            )
        chunks, size = [], 0
        try:
            # Decoded bytes are counted, so a small gzip bomb is stopped too.
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > self.max_bytes:
                    raise FetchError(
                        FailureReason.TOO_LARGE,
                        f"body over the {self.max_bytes} byte cap",
                        http_status=response.status_code,
                    )
                if time.monotonic() > deadline:  # a server that drips bytes forever
                    raise FetchError(
                        FailureReason.TIMEOUT, f"body not complete within {self.timeout:g} s"
                    )
                chunks.append(chunk)
        except httpx.TimeoutException:
            raise FetchError(FailureReason.TIMEOUT, f"body not complete within {self.timeout:g} s") from None
        except httpx.DecodingError as exc:
            raise FetchError(FailureReason.PARSE_ERROR, f"undecodable body: {exc}") from None
        except httpx.TransportError as exc:
            raise FetchError(FailureReason.NETWORK_ERROR, f"{type(exc).__name__}: {exc}") from None
        return b"".join(chunks)

"""The failure taxonomy of a fetch, defined once.

An adapter raises ``FetchError(reason, message)`` (pipeline/core/errors.py); the collector
records the reason as the source's ``last_failure_reason`` and backs off by it
(pipeline/core/backoff.py). Nothing else invents failure codes.
"""

from __future__ import annotations

from enum import StrEnum


class FailureReason(StrEnum):
    NETWORK_ERROR = "network_error"  # DNS, refused, reset: the host or the path to it
    TIMEOUT = "timeout"  # no answer within PIPELINE_HTTP_TIMEOUT_SECONDS
    HTTP_4XX = "http_4xx"  # the server says the request is wrong (404, 410, 403, ...)
    HTTP_5XX = "http_5xx"  # the server failed
    RATE_LIMITED = "rate_limited"  # 429
    # A bot challenge (a captcha, "Just a moment...") answered instead of the page: the
    # site blocks automated reads for now (pipeline/fetching/page.py ``challenge``).
    BLOCKED = "blocked"
    YOUTUBE_QUOTA = "youtube_quota"  # the YouTube Data API's daily quota is spent
    PARSE_ERROR = "parse_error"  # the body is not a feed / page the adapter can read
    TOO_LARGE = "too_large"  # the body passed PIPELINE_MAX_RESPONSE_BYTES
    BLOCKED_ADDRESS = "blocked_address"  # the SSRF guard refused the address
    INVALID_CONFIG = "invalid_config"  # the source's own settings cannot work


# Failures that say something about the source itself rather than about the moment:
# retrying soon will not help, so they back off longer and can disable the source.
PERMANENT = frozenset(
    {
        FailureReason.HTTP_4XX,
        FailureReason.PARSE_ERROR,
        FailureReason.TOO_LARGE,
        FailureReason.BLOCKED_ADDRESS,
        FailureReason.INVALID_CONFIG,
    }
)


# A delivery fails with a code too (notifications' error counts): a webhook's failures
# are those of a fetch that can happen to a POST (never a spent YouTube quota or a body
# that does not parse: a delivery parses nothing); these are the ones no fetch has.
CHANNEL_ERROR = "channel_error"  # the channel said no (Apprise could not deliver)
WORKER_STOPPED = "worker_stopped"  # claimed again and again, no send finished
CHANNEL_BUG = "channel_bug"  # a channel raised something unexpected
_NOT_OF_A_DELIVERY = frozenset({FailureReason.YOUTUBE_QUOTA, FailureReason.PARSE_ERROR, FailureReason.BLOCKED})
DELIVERY_CODES = (*(reason.value for reason in FailureReason if reason not in _NOT_OF_A_DELIVERY),
                  CHANNEL_ERROR, WORKER_STOPPED, CHANNEL_BUG)

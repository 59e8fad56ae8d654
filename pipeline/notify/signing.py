"""Webhook secrets: their format, and the key each signs with (Standard Webhooks).

Apart from pipeline/notify/delivery.py, which sends, so that the catalogue can make and
check a secret without loading the HTTP client.
"""

from __future__ import annotations

import base64
import binascii
import secrets

# Webhook secrets in the Standard Webhooks format: "whsec_" and the base64 of random
# bytes, the key. Every Standard Webhooks library takes such a secret as given
# (``Webhook(secret)`` in Python, ``new Webhook(secret)`` in JavaScript). A secret
# without the prefix (those made before, or one a user chose) keys the HMAC with its own
# bytes, as ``Webhook(secret.encode())`` does.
SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A new webhook secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_problem(secret: str) -> str | None:
    """What is wrong with a webhook secret given in the Standard Webhooks format, or None."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        return "a secret that starts with whsec_ is the base64 of its key: this one is not base64"
    return None if len(key) >= 16 else "a whsec_ secret's key is at least 16 bytes"


def signing_key(secret: str) -> str | bytes:
    """The key ``Webhook`` signs with: a ``whsec_`` secret as every library reads it, any
    other as its own bytes."""
    return secret if secret.startswith(SECRET_PREFIX) else secret.encode()

"""Reasoning handed to stateless clients: opaque, integrity-protected, restorable.

``include: ["reasoning.encrypted_content"]`` gives reasoning items an ``encrypted_content``:
the reasoning text, signed with the server's key (HMAC-SHA256), so a client that stores
nothing (``store: false``) can send it back and Podium can trust it into the prompt. The key
comes from ``--secret-key`` / ``PODIUM_SECRET_KEY`` or is made once in the data directory; every
replica must share it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from podium.errors import InvalidRequestError


def load_key(explicit: str | None, directory: Path) -> bytes:
    if explicit:
        return explicit.encode()
    path = directory / "secret.key"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(secrets.token_hex(32).encode())
        os.replace(tmp, path)
    return path.read_bytes().strip()


class Sealer:
    def __init__(self, key: bytes):
        self._key = key

    def seal(self, text: str) -> str:
        body = base64.urlsafe_b64encode(text.encode()).decode()
        return f"podium.v1.{body}.{self._mac(body)}"

    def unseal(self, token: str) -> str:
        try:
            prefix, version, body, mac = token.rsplit(".", 3)
            if (prefix, version) != ("podium", "v1") or not hmac.compare_digest(
                    mac, self._mac(body)):
                raise ValueError
            return base64.urlsafe_b64decode(body.encode()).decode()
        except ValueError:
            raise InvalidRequestError("A reasoning item's encrypted_content is not valid for "
                                      "this server", param="input") from None

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

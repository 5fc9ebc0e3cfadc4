"""Reasoning handed to clients: encrypted, bound to its owner, restorable.

``include: ["reasoning.encrypted_content"]`` gives Responses' reasoning items an
``encrypted_content``, and Messages' thinking blocks carry a ``signature``: the reasoning,
sealed, so a client that stores nothing (``store: false``) can send it back and Podium can
trust it into the prompt. A seal is AES-256-GCM under a key derived (HKDF-SHA256) from the
server's secret, with the owner (the API key's id) as associated data: a client can neither
read it (``thinking.display: "omitted"`` hides the text for real) nor forge or alter one, and
a seal issued to one API key does not open for another. The secret comes from
``--secret-key`` / ``PODIUM_SECRET_KEY`` or is made once in the data directory; every replica
must share it.

Tokens read ``podium.v2.<base64url(nonce | ciphertext | tag)>``. Tokens of the old
``podium.v1.`` form (readable, signed only) are refused with their own message; tokens longer
than ``--max-seal-bytes`` are refused before anything is decoded.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from podium.errors import InvalidRequestError

PREFIX = "podium.v2."
OLD_PREFIX = "podium.v1."
_NONCE = 12
_INFO = b"podium seal v2"           # the derived key is for seals alone


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
    def __init__(self, key: bytes, max_bytes: int = 2 * 1024 * 1024):
        derived = HKDF(algorithm=SHA256(), length=32, salt=None, info=_INFO).derive(key)
        self._aead = AESGCM(derived)
        self._max = max_bytes

    def seal(self, text: str, owner: str) -> str:
        """``text`` encrypted for ``owner`` alone."""
        nonce = secrets.token_bytes(_NONCE)
        body = nonce + self._aead.encrypt(nonce, text.encode(), _aad(owner))
        return PREFIX + base64.urlsafe_b64encode(body).decode().rstrip("=")

    def unseal(self, token: str, owner: str, *, param: str | None = None) -> str:
        """The text of a seal this server issued to ``owner``; a 400 naming ``param`` for
        anything else (forged, altered, another owner's: one message, so the answer tells
        a prober nothing about which)."""
        if not isinstance(token, str) or not token.startswith(PREFIX):
            if isinstance(token, str) and token.startswith(OLD_PREFIX):
                raise InvalidRequestError(
                    "This seal is in Podium's old format (podium.v1), which is no longer "
                    "accepted: send the item without it", param=param)
            raise _invalid(param)
        if len(token) > self._max:
            raise InvalidRequestError(
                f"A seal is at most {self._max} characters (--max-seal-bytes); this one has "
                f"{len(token)}", param=param)
        body = token[len(PREFIX):]
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            if len(raw) < _NONCE + 16:
                raise ValueError
            return self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], _aad(owner)).decode()
        except (ValueError, binascii.Error, InvalidTag):
            raise _invalid(param) from None


def _aad(owner: str) -> bytes:
    return b"podium-owner:" + owner.encode()


def _invalid(param: str | None) -> InvalidRequestError:
    return InvalidRequestError("This sealed content (an encrypted_content or a signature) was "
                               "not issued by this server to this API key, or it was altered",
                               param=param)

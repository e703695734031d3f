"""The gateway's API keys: a TOML file naming each key, its scopes and the SHA-256 of its
token (never the token), and ``Keys``, the file as the gateway reads it.

A token is a random 32-byte secret (``new_token``), shown once when its key is created; its
SHA-256 is enough to store (a hash of a random secret cannot be guessed back, no salt or
slow hash needed) and a presented token is compared with ``hmac.compare_digest``. The file::

    [keys.shop-web]
    scopes = ["decide"]
    sha256 = "9f86d0..."

``Keys`` reads the file again when its modification time changes (looked at most once each
``look_every`` seconds) or when ``reload`` is called (on SIGHUP); a version that does not
load is logged and the last good keys stay.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "keys.toml"
>>> token = create(path, "shop-web", ["decide"])
>>> Keys(path).principal(token.encode())
Key(name='shop-web', scopes=frozenset({'decide'}))
>>> Keys(path).principal(b"tsi_guessed") is None
True
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SCOPES", "Key", "Keys", "KeysError", "create", "load", "revoke", "token_hash"]

log = logging.getLogger(__name__)

#: What a key may do: ``decide`` (decisions, feedback, flags), ``read`` (the live page and
#: the experiments), ``admin`` (change the experiments; it implies ``read``, not ``decide``).
SCOPES = ("decide", "read", "admin")
#: A key's name: what the audit log shows and ``tsi keys revoke`` takes.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HASH = re.compile(r"[0-9a-f]{64}")
#: The longest token looked at, in bytes: longer ones are refused unhashed.
MAX_TOKEN = 256


class KeysError(ValueError):
    """A keys file that does not load, or a change to it that is refused."""


@dataclass(frozen=True)
class Key:
    """One key as the gateway knows it: its name and what it may do."""

    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        """Whether the key has ``scope`` (``admin`` implies ``read``).

        >>> Key("ops", frozenset({"admin"})).allows("read")
        True
        >>> Key("ops", frozenset({"admin"})).allows("decide")
        False
        """
        return scope in self.scopes or (scope == "read" and "admin" in self.scopes)


def token_hash(token: bytes) -> str:
    """The text stored for ``token``: its SHA-256, in hex.

    >>> token_hash(b"abc")[:16]
    'ba7816bf8f01cfea'
    """
    return hashlib.sha256(token).hexdigest()


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe, after ``tsi_`` (a scanner can spot it).

    >>> new_token().startswith("tsi_"), len(new_token())
    (True, 47)
    """
    return "tsi_" + secrets.token_urlsafe(32)


def load(path: Path) -> dict[str, tuple[Key, str]]:
    """The keys in ``path`` by name, each with its stored hash; ``KeysError`` naming the
    file and what is wrong with it otherwise."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KeysError(f"keys file {path}: {exc}") from None
    unknown = sorted(set(document) - {"keys"})
    if unknown:
        raise KeysError(f"keys file {path}: unknown table {unknown[0]!r} (only [keys.NAME])")
    table = document.get("keys", {})
    if not isinstance(table, dict):
        raise KeysError(f"keys file {path}: 'keys' must be a table, got {table!r}")
    keys = {name: _entry(path, name, entry) for name, entry in table.items()}
    seen: dict[str, str] = {}
    for name, (_, stored) in keys.items():
        if stored in seen:
            raise KeysError(f"keys file {path}: keys {seen[stored]!r} and {name!r} share a hash")
        seen[stored] = name
    return keys


def _entry(path: Path, name: str, entry: object) -> tuple[Key, str]:
    """One ``[keys.NAME]`` table, checked."""
    where = f"keys file {path}, key {name!r}"
    if not NAME.fullmatch(name):
        raise KeysError(f"{where}: a name is letters, digits, '_', '.', '-' (at most 64)")
    if not isinstance(entry, dict):
        raise KeysError(f"{where}: must be a table, got {entry!r}")
    unknown = sorted(set(entry) - {"scopes", "sha256"})
    if unknown:
        raise KeysError(f"{where}: unknown field {unknown[0]!r} (fields: scopes, sha256)")
    scopes, stored = entry.get("scopes"), entry.get("sha256")
    if not isinstance(scopes, list) or not scopes:
        raise KeysError(f"{where}: scopes must be a list naming at least one, got {scopes!r}")
    bad = [scope for scope in scopes if scope not in SCOPES]
    if bad:
        raise KeysError(f"{where}: unknown scope {bad[0]!r} (scopes: {', '.join(SCOPES)})")
    if not isinstance(stored, str) or not _HASH.fullmatch(stored):
        raise KeysError(f"{where}: sha256 must be 64 lowercase hex digits, got {stored!r}")
    return Key(name, frozenset(scopes)), stored


def save(path: Path, keys: dict[str, tuple[Key, str]]) -> None:
    """Write ``keys`` to ``path`` at once (a reader sees the old file or the new one)."""
    lines = ["# tsi API keys (tsi keys create/list/revoke): names, scopes, tokens' SHA-256."]
    for name, (key, stored) in sorted(keys.items()):
        scopes = ", ".join(f'"{scope}"' for scope in SCOPES if scope in key.scopes)
        lines += ["", f"[keys.{name}]", f"scopes = [{scopes}]", f'sha256 = "{stored}"']
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")
    temporary.chmod(0o600)
    os.replace(temporary, path)


def create(path: Path, name: str, scopes: Iterable[str]) -> str:
    """Add key ``name`` with ``scopes`` to ``path`` (made when missing); its token, which
    only its hash is stored of. ``KeysError`` (the file unchanged) for a taken or bad name,
    an unknown scope, or a file that does not load."""
    keys = load(path) if path.exists() else {}
    if name in keys:
        raise KeysError(f"keys file {path}: a key named {name!r} exists (revoke it first)")
    token = new_token()
    keys[name] = _entry(path, name, {"scopes": list(scopes), "sha256": token_hash(token.encode())})
    save(path, keys)
    return token


def revoke(path: Path, name: str) -> None:
    """Remove key ``name`` from ``path``: its token is refused from then on."""
    keys = load(path)
    if name not in keys:
        known = ", ".join(sorted(keys)) or "none"
        raise KeysError(f"keys file {path}: no key named {name!r} (keys: {known})")
    del keys[name]
    save(path, keys)


class Keys:
    """The keys of ``path`` (``KeysError`` when it does not load at the start)."""

    def __init__(self, path: str | Path, look_every: float = 1.0) -> None:
        self.path = Path(path)
        self.look_every = look_every
        self._stamp = self._modified()
        self._keys = list(load(self.path).values())
        self._looked = time.monotonic()

    def __len__(self) -> int:
        return len(self._keys)

    def principal(self, token: bytes) -> Key | None:
        """The key whose token ``token`` is, or None."""
        self._look()
        if not token or len(token) > MAX_TOKEN:
            return None
        presented = token_hash(token)
        found = None
        for key, stored in self._keys:  # every one compared: the time says nothing of which
            if hmac.compare_digest(presented, stored):
                found = key
        return found

    def reload(self) -> None:
        """Read the file again; when it does not load, log why and keep the last keys."""
        self._stamp = self._modified()
        try:
            self._keys = list(load(self.path).values())
        except KeysError as exc:
            log.warning("%s; the last good keys (%d) stay", exc, len(self._keys))

    def _look(self) -> None:
        now = time.monotonic()
        if now - self._looked >= self.look_every:
            self._looked = now
            if self._modified() != self._stamp:
                self.reload()

    def _modified(self) -> tuple[int, int, int] | None:
        """The file's modification time, size and inode (a replaced file is a new one)."""
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

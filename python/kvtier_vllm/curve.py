"""CurveZMQ keys for a sidecar with authentication on (see docs/security.md).

A client needs the sidecar's public key and its own key pair; the sidecar's allow-list gives the
client's public key a role (``lookup`` for a scheduler, ``worker`` for an engine worker). Keys are
Z85 text (40 characters), as ``kvtier keygen`` writes them; the public key is derived from the
secret one, so a client needs only its ``.key`` file.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

import zmq

from .errors import ConfigError

__all__ = ["CurveKeys", "load_client_keys", "is_z85_key"]

_Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


def is_z85_key(s: object) -> bool:
    """True for 40 characters of the Z85 alphabet."""
    return isinstance(s, str) and _Z85.match(s) is not None


@dataclass(frozen=True)
class CurveKeys:
    """A client's CurveZMQ keys, each Z85 text."""

    #: The sidecar's public key (its ``NAME.pub``).
    server_public_key: str
    #: This client's public key (on the sidecar's allow-list).
    public_key: str
    #: This client's secret key.
    secret_key: str = ""

    def __repr__(self) -> str:  # never print the secret key
        return f"CurveKeys(server_public_key={self.server_public_key!r}, public_key={self.public_key!r})"

    def apply(self, sock: zmq.Socket) -> None:
        """Makes ``sock`` a Curve client of the sidecar (before it connects)."""
        sock.curve_serverkey = self.server_public_key.encode()
        sock.curve_publickey = self.public_key.encode()
        sock.curve_secretkey = self.secret_key.encode()


def _read_key(path: str, what: str, secret: bool) -> str:
    try:
        if secret and os.name == "posix" and stat.S_IMODE(os.stat(path).st_mode) & 0o077:
            raise ConfigError(f"{what} {path} is readable by group or others; chmod 600 it")
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e}") from None
    if not is_z85_key(text):
        raise ConfigError(f"{what} {path} must hold a CurveZMQ key: 40 characters of Z85 text (kvtier keygen)")
    return text


def load_client_keys(server_public_key: str, client_secret_key_file: str) -> CurveKeys:
    """The keys of a client: ``server_public_key`` is the sidecar's public key as Z85 text or the
    path of its ``.pub`` file; ``client_secret_key_file`` the client's ``.key`` file (mode 0600).

    :raises ConfigError: for an unreadable or malformed key, or a secret key file others may read.
    """
    if not zmq.has("curve"):
        raise ConfigError("this pyzmq/libzmq has no CURVE support (pip's pyzmq wheels do)")
    server = server_public_key if is_z85_key(server_public_key) else _read_key(server_public_key, "server public key file", False)
    secret = _read_key(client_secret_key_file, "client secret key file", True)
    public = zmq.curve_public(secret.encode()).decode()
    return CurveKeys(server, public, secret)

"""Who a peer is: the run's secret, the key of each role, and how a ZeroMQ client socket proves them.

    launcher: RunSecret.ensure(run_dir)              RUN_DIR/secret, 0600, 32 random bytes (hex)
              Credentials.for_role(secret, "generator").to_env()   -> the child's environment
    child:    Credentials.from_env()  (or .from_run_dir(run_dir, role) when started by hand)
              creds.apply(sock, name, endpoint)     before sock.connect(endpoint)

A role's key is HMAC-SHA256(secret, role): a process handed the generator key can prove it is a
generator and nothing else; only the launcher (and the hub, which verifies) hold the secret itself.
On a loopback (or ipc://) endpoint the key travels as a ZeroMQ PLAIN password (user name = role);
anywhere else the connection is ZeroMQ CURVE (encrypted, with keys derived from the role key and the
secret), so nothing secret ever crosses a network in clear. The peer's process name travels as
connection metadata (`X-Name`) and is what the hub checks lease ownership against.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

ROLES = ("generator", "reward", "learner", "client", "launcher")
SECRET_FILE = "secret"
ENV_ROLE, ENV_KEY, ENV_SERVER = "ASYNCRL_ROLE", "ASYNCRL_PEER_KEY", "ASYNCRL_HUB_PUBLIC_KEY"


def _hmac(key: bytes, what: str) -> bytes:
    return hmac.new(key, what.encode(), hashlib.sha256).digest()  # 32 bytes


class RunSecret:
    """The per-run secret in RUN_DIR/secret (owner read/write only)."""

    @staticmethod
    def ensure(run_dir: str | Path) -> bytes:
        """Create the secret if the run has none (atomic: link of a finished temp file), then load it."""
        path = Path(run_dir) / SECRET_FILE
        if not path.exists():
            tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # fails if another process created it first: theirs wins
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        return RunSecret.load(run_dir)

    @staticmethod
    def load(run_dir: str | Path) -> bytes:
        path = Path(run_dir) / SECRET_FILE
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise PermissionError(f"{path} has mode {mode:o}: the run secret must be private; chmod 600 {path}")
        text = path.read_text().strip()
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            raise ValueError(f"{path}: not a hex secret; delete it and let the launcher create a new one") from None
        if len(secret) < 16:
            raise ValueError(f"{path}: secret of {len(secret)} bytes is too short (>= 16); delete it and relaunch")
        return secret


def role_key(secret: bytes, role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role {role!r}: must be one of {', '.join(ROLES)}")
    return _hmac(secret, f"role:{role}").hex()


def curve_pair(seed: bytes) -> tuple[bytes, bytes]:
    """A CURVE key pair (z85 public, z85 secret) derived from `seed` (deterministic)."""
    secret_z85 = z85.encode(_hmac(seed, "curve"))
    return zmq.curve_public(secret_z85), secret_z85


def server_pair(secret: bytes) -> tuple[bytes, bytes]:
    return curve_pair(_hmac(secret, "curve-server"))


def is_local(endpoint: str) -> bool:
    """Loopback tcp, ipc:// or inproc://: PLAIN suffices; anything else needs CURVE."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name or a host name: not provably loopback


@dataclass(kw_only=True, slots=True, frozen=True)
class Credentials:
    role: str
    key: str  # hex HMAC(secret, role)
    server_public: str = ""  # z85 CURVE public key of the hub (needed for non-loopback endpoints)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Credentials.role={self.role!r}: must be one of {', '.join(ROLES)}")

    @classmethod
    def for_role(cls, secret: bytes, role: str) -> Credentials:
        return cls(role=role, key=role_key(secret, role), server_public=server_pair(secret)[0].decode())

    @classmethod
    def from_run_dir(cls, run_dir: str | Path, role: str) -> Credentials:
        return cls.for_role(RunSecret.load(run_dir), role)

    @classmethod
    def from_env(cls) -> Credentials | None:
        role, key = os.environ.get(ENV_ROLE), os.environ.get(ENV_KEY)
        if not role or not key:
            return None
        return cls(role=role, key=key, server_public=os.environ.get(ENV_SERVER, ""))

    def to_env(self) -> dict[str, str]:
        return {ENV_ROLE: self.role, ENV_KEY: self.key, ENV_SERVER: self.server_public}

    def apply(self, sock: zmq.Socket, name: str, endpoint: str) -> None:
        """Set up `sock` (before connect) to prove this role to the hub at `endpoint`."""
        sock.setsockopt(zmq.METADATA, f"X-Name:{name}".encode()[:255])
        if is_local(endpoint):
            sock.plain_username, sock.plain_password = self.role.encode(), self.key.encode()
            return
        if not self.server_public:
            raise ValueError(f"{endpoint} is not loopback: CURVE needs the hub's public key "
                             f"(set {ENV_SERVER} or build Credentials from the run secret)")
        public, secret_z85 = curve_pair(bytes.fromhex(self.key))
        sock.curve_serverkey = self.server_public.encode()
        sock.curve_publickey, sock.curve_secretkey = public, secret_z85

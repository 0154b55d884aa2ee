"""`ZapHandler`: the ZeroMQ authentication (ZAP, RFC 27) handler of a server that binds for the run.

    peer ──connect (PLAIN role/key, or CURVE)──► server socket ──ZAP request──► ZapHandler thread
                                                       ◄── 200 + User-Id = role, or 400 + reason

libzmq asks the handler (inproc://zeromq.zap.01 of the server's context) once per connection, before
any message of that connection is delivered; a refused connection never delivers anything. The role
the handler returns is readable on every message of the connection (`frame.get("User-Id")`).

Threads: one daemon thread per handler answers ZAP requests; it shares only `counters` (two ints, written
by that thread, read by the server's stats); refusal reasons go to the log (the first 20, then every 1000th).

`secure(sock, endpoint)` chooses the mechanism from the address the server binds: PLAIN (the role
key as password) on loopback / ipc, CURVE everywhere else (binding a non-loopback address without
CURVE is not possible through this module).
"""

from __future__ import annotations

import hmac
import logging
import threading

import zmq
from zmq.utils import z85

from asyncrl.net.credentials import ROLES, curve_pair, is_local, role_key, server_pair

log = logging.getLogger("asyncrl.net.zap")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
POLL_MS = 100


class ZapHandler:
    def __init__(self, ctx: zmq.Context, secret: bytes) -> None:
        self.secret = secret
        self.keys = {role: role_key(secret, role) for role in ROLES}
        self.curve_roles = {curve_pair(bytes.fromhex(k))[0]: role for role, k in self.keys.items()}
        self.counters = {"accepted": 0, "refused": 0}
        self._sock = zmq.Context.shadow(ctx.underlying).socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="zap", daemon=True)
        self._thread.start()

    def secure(self, sock: zmq.Socket, endpoint: str) -> None:
        """Make `sock` (a server, before bind) require the run's credentials."""
        sock.zap_domain = b"asyncrl"
        if is_local(endpoint):
            sock.plain_server = True
            return
        public, secret_z85 = server_pair(self.secret)
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = public, secret_z85

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(linger=0)

    # ------------------------------------------------------------------ thread

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._sock.poll(POLL_MS):
                    continue
                frames = self._sock.recv_multipart()
            except zmq.ZMQError:  # context terminated under us: the server is closing
                return
            self._sock.send_multipart(self._answer(frames))

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6:
            return self._reply(b"1.0", b"", False, "malformed ZAP request")
        version, request_id, _domain, address, _identity, mechanism, *creds = frames
        role, reason = self._check(mechanism, creds)
        if role is None:
            self.counters["refused"] += 1
            if self.counters["refused"] <= 20 or self.counters["refused"] % 1000 == 0:
                log.warning("refused connection #%d from %s: %s", self.counters["refused"],
                            address.decode(errors="replace"), reason)
            return self._reply(version, request_id, False, reason)
        self.counters["accepted"] += 1
        return self._reply(version, request_id, True, "OK", role)

    def _check(self, mechanism: bytes, creds: list[bytes]) -> tuple[str | None, str]:
        if mechanism == b"PLAIN" and len(creds) == 2:
            role = creds[0].decode(errors="replace")
            if role not in self.keys:
                return None, f"unknown role {role[:40]!r}"
            if not hmac.compare_digest(creds[1], self.keys[role].encode()):
                return None, f"wrong key for role {role!r}"
            return role, ""
        if mechanism == b"CURVE" and len(creds) == 1 and len(creds[0]) == 32:
            role = self.curve_roles.get(z85.encode(creds[0]))
            return (role, "") if role else (None, "CURVE key of no role of this run")
        return None, f"mechanism {mechanism[:20]!r} with {len(creds)} credential frames is not accepted"

    @staticmethod
    def _reply(version: bytes, request_id: bytes, ok: bool, text: str, user: str = "") -> list[bytes]:
        code = b"200" if ok else b"400"
        return [version, request_id, code, text.encode()[:250], user.encode(), b""]

"""A raw data-plane peer for tests that play a hostile or broken one: frames
as bytes (the 64-byte header of src/plexus/transport/internal/frame_socket.h)
and the handshake that opens every connection
(src/plexus/transport/internal/handshake.h), written from those specs."""
import hashlib
import hmac
import os
import socket
import struct

HEADER = struct.Struct("<IHHHHiQQiIQ16s")
assert HEADER.size == 64
MAGIC, VERSION = 0x44584C50, 3
(PUSH, PUSH_ERROR, PUT, FETCH, WAIT, ACK, DATA, ERROR, CHALLENGE, HELLO,
 WELCOME) = range(1, 12)
ROLE_CODES = {"client": 1, "worker": 2}


def credential(secret_hex, role, ident=0):
    """common/credentials.h: the first 16 bytes of
    HMAC-SHA256(secret, "plexus/" role "/" id)."""
    return hmac.new(bytes.fromhex(secret_hex), f"plexus/{role}/{ident}".encode(),
                    hashlib.sha256).digest()[:16]


def frame(kind, buffer_id=0, shard=0, payload=b"", claim=None):
    size = len(payload) if claim is None else claim
    return HEADER.pack(MAGIC, VERSION, kind, 0, 0, shard, buffer_id, size, 0,
                       0, 0, b"\0" * 16) + payload


def connect(address, timeout=20):
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host.strip("[]"), int(port)),
                                    timeout=timeout)


def _recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return data


def read_frame(sock):
    """(kind, payload bytes) of the next frame."""
    fields = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    kind, payload_bytes = fields[2], fields[7]
    return kind, _recv_exactly(sock, payload_bytes)


def read_reply(sock):
    """(kind, payload as text): a worker's reply to a request."""
    kind, body = read_frame(sock)
    return kind, body.decode(errors="replace")


def _proof(cred, side, role, ident, nonce_a, nonce_c):
    message = (f"plexus/dp/{VERSION}/{side}/{role}/{ident}/".encode() +
               nonce_a + nonce_c)
    return hmac.new(cred, message, hashlib.sha256).digest()


def handshake(sock, role, ident, cred):
    """Opens the connection as (role, ident) proving `cred`. Returns None
    once the worker welcomed it (and proved it knows `cred`), else the
    message of the ERROR it answered with."""
    kind, nonce_a = read_frame(sock)
    assert kind == CHALLENGE, f"the worker opened with frame type {kind}"
    nonce_c = os.urandom(32)
    proof = _proof(cred, "connector", role, ident, nonce_a, nonce_c)
    sock.sendall(frame(HELLO, ident, ROLE_CODES[role], nonce_c + proof))
    kind, body = read_frame(sock)
    if kind == ERROR:
        return body.decode(errors="replace")
    assert kind == WELCOME, f"the worker answered HELLO with frame type {kind}"
    assert hmac.compare_digest(
        body, _proof(cred, "acceptor", role, ident, nonce_a, nonce_c)), \
        "the worker could not prove it knows the credential"
    return None


def connect_as(address, secret_hex, role, ident=0):
    """A connection that proved (role, ident) with the credential derived
    from `secret_hex` (what that client or a worker holds)."""
    sock = connect(address)
    refused = handshake(sock, role, ident, credential(secret_hex, role, ident))
    assert refused is None, refused
    return sock

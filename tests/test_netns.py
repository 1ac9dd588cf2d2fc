"""Hosts in network namespaces of their own on one machine (as containers or
pods on one Kubernetes node): one kernel and one /etc/machine-id, but the
abstract unix socket of the shared-memory data plane is per namespace.

Every wait here is bounded: before the fix, a slice over two such hosts hung
for good in all_reduce (each worker pushed to the other's unreachable unix
socket, logged a warning, and the consumer waited forever).
"""
import concurrent.futures
import os

import numpy as np
import pytest

import plexus
from plexus import _core
from netns import NetnsLab
from tls_cert import self_signed

WAIT_S = 30  # what a result may take before the test calls it a hang


def bounded(fn, what, timeout=WAIT_S):
    """fn() on a thread of its own; AssertionError if it takes longer than
    `timeout` (the thread is left to the teardown, which kills the
    processes it waits on)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(fn).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"{what}: no result within {timeout} s (hang)")
    finally:
        pool.shutdown(wait=False)


def fresh_status(address):
    """The server's status once every worker has reported after now."""
    from plexus._status import decode_status as _decode_status
    return _decode_status(plexus._core.cluster_status(address, True))


@pytest.fixture
def lab():
    lab = NetnsLab.create()
    yield lab
    lab.close()


def start(lab, tmp_path, hidden=False):
    """A server in this namespace and two workers, each in a namespace of its
    own. hidden=True: each worker advertises an address that only this
    namespace routes to, so the client reaches both but they cannot reach
    each other."""
    server = lab.start_server(tmp_path / "server.log")
    for _ in range(2):
        host = lab.add_host()
        lab.start_worker(server, host, tmp_path / f"{host.name}.log",
                         data_host=host.hidden if hidden else None)
    return server


def readme_example(client):
    """README's ten lines, over two hosts, plus a put/fetch round trip of a
    buffer large enough to travel as shared memory where it can."""
    s = client.slice(2, mesh=(2,), axis_names=("data",), placement="spread")
    x = s.put(np.arange(8, dtype=np.float32), plexus.P("data"))
    double = s.program("scale", x, factor=2.0)
    total = s.program("reduce_sum", x)
    psum = s.program("all_reduce",
                     plexus.Spec((), "float32", plexus.partial()))
    y = psum(total(double(x)))
    big = np.random.default_rng(7).standard_normal((512, 1024)).astype(
        np.float32)  # 2 MiB, 1 MiB per host
    z = s.put(big, plexus.P("data"))
    triple = s.program("scale", z, factor=3.0)
    return (float(np.asarray(y)), str(y.sharding), np.asarray(z),
            np.asarray(triple(z)))


def test_a_slice_over_hosts_in_two_namespaces_computes_what_the_embedded_default_does(
        lab, tmp_path):
    with plexus.local(hosts=2, devices_per_host=1,
                      log_file=str(tmp_path / "embedded.log")) as c:
        want = bounded(lambda: readme_example(c.connect()), "embedded default")
    server = start(lab, tmp_path)
    client = lab.connect(server.address)
    try:
        st = plexus.status(server.address)
        hosts = {w["host_name"]: w for w in st["workers"] if w["alive"]}
        assert set(hosts) == {"host0", "host1"}
        for h in lab.hosts:  # each data plane binds its namespace's address
            assert hosts[h.name]["data_address"].startswith(h.address + ":")
        got = bounded(lambda: readme_example(client),
                      "all_reduce and put/fetch across namespaces")
    finally:
        client.close()
    assert got[0] == want[0] == 56.0
    assert got[1] == want[1]
    np.testing.assert_array_equal(got[2], want[2])  # the bytes put
    np.testing.assert_array_equal(got[3], want[3])
    # The workers pushed to each other (partial sums), and every process
    # exits cleanly.
    st = fresh_status(server.address)
    assert all(w["stats"].get("bytes_sent", 0) > 0 for w in st["workers"])
    assert lab.stop() == []


def test_a_transfer_that_cannot_be_delivered_fails_its_consumers(
        lab, tmp_path):
    server = start(lab, tmp_path, hidden=True)
    client = lab.connect(server.address)
    try:
        s = client.slice(2, mesh=(2,), axis_names=("data",),
                         placement="spread")
        x = s.put(np.arange(8, dtype=np.float32), plexus.P("data"))
        # Put and fetch reach each worker: the client can route to both.
        np.testing.assert_array_equal(
            bounded(lambda: np.asarray(x), "fetch"), np.arange(8))
        psum = s.program("all_reduce",
                         plexus.Spec((), "float32", plexus.partial()))
        y = psum(s.program("reduce_sum", x)(x))

        def fetch():
            with pytest.raises(plexus.PlexusError) as e:
                np.asarray(y)
            return str(e.value)
        message = bounded(fetch, "a future whose input cannot be delivered")
    finally:
        client.close()
    assert "could not be delivered" in message, message
    assert "transfer of buffer" in message, message
    # The worker that answered is fine: its error is not a lost worker.
    assert "lost worker" not in message, message
    # The cause, as the sender saw it: no route to the peer's address.
    assert "unreachable" in message.lower(), message
    assert lab.stop() == []


def make_certificate(tmp_path, *ips):
    """A self-signed certificate naming `ips` (its own CA) and its key."""
    return self_signed(tmp_path, *(f"IP:{ip}" for ip in ips))


def compute(client):
    s = client.slice(2, placement="spread")
    x = s.put(np.arange(8, dtype=np.float32), plexus.P("devices"))
    return np.asarray(s.program("scale", x, factor=2.0)(x))


def test_a_server_off_loopback_needs_credentials_then_serves_other_namespaces(
        lab, tmp_path):
    a, b, c = lab.add_host(), lab.add_host(), lab.add_host()
    # Asked to listen on namespace a's address with no secret: it refuses,
    # saying what to set.
    code, text = lab.run_server_until_exit(tmp_path / "refused.log", a,
                                           secret="")
    assert code == 1, text
    assert "is not a loopback address" in text, text
    assert "PLEXUS_CLUSTER_SECRET" in text and "--secret-file" in text, text

    # With the secret it serves: workers in namespaces b and c, the client
    # here (a namespace of its own).
    server = lab.start_server(tmp_path / "server.log", host=a)
    assert server.address.startswith(a.address + ":"), server.address
    # A worker without the secret does not start (loopback or not).
    wlog = tmp_path / "no-secret-worker.log"
    with pytest.raises(RuntimeError, match="did not come up"):
        lab.start_worker(server, b, wlog, secret="")
    failed = lab.processes.pop()
    assert failed.popen.wait(timeout=30) == 1
    os.close(failed.ready_fd)
    assert "no cluster secret" in wlog.read_text(), wlog.read_text()
    for host in (b, c):
        lab.start_worker(server, host, tmp_path / f"{host.name}.log")

    # Off loopback no session is anonymous, and a token of another cluster
    # opens nothing.
    with pytest.raises(plexus.PermissionDeniedError,
                       match="PLEXUS_TENANT_TOKEN"):
        plexus.connect(server.address, name="anonymous")
    with pytest.raises(plexus.PermissionDeniedError,
                       match="does not match tenant 'research'"):
        plexus.connect(server.address, tenant="research",
                       token=_core.tenant_token("research",
                                                _core.new_cluster_secret()))
    client = lab.connect(server.address, tenant="research")
    try:
        got = bounded(lambda: compute(client), "a slice over namespaces b, c")
        np.testing.assert_array_equal(got, 2 * np.arange(8))
        st = plexus.status(server.address)
        assert [cl["tenant"] for cl in st["clients"]] == ["research"]
        assert {w["host_name"] for w in st["workers"]} == {b.name, c.name}
        # The client's ops went to the server's ops listener over TCP (its
        # unix socket is in namespace a), as frames, and were applied.
        counters = client.counters()
        assert counters["messages_sent_as_frames"] >= 3, counters
        assert counters["messages_sent_as_frames"] == \
            counters["messages_sent"], counters
        assert st["clients"][0].get("ops_on_frames"), st["clients"]
    finally:
        client.close()
    assert lab.stop() == []
    token = _core.tenant_token("research", lab.secret)
    for log in tmp_path.glob("*.log"):
        text = log.read_text(errors="replace").lower()
        assert lab.secret not in text and token not in text, log


def test_tls_on_the_control_plane_between_namespaces(lab, tmp_path,
                                                     monkeypatch):
    a, b = lab.add_host(), lab.add_host()
    cert, key = make_certificate(tmp_path, a.address)
    server = lab.start_server(
        tmp_path / "server.log", host=a,
        extra=["--tls-cert", str(cert), "--tls-key", str(key)])
    assert "(TLS;" in (tmp_path / "server.log").read_text()
    lab.start_worker(server, b, tmp_path / "b.log",
                     env_extra={"PLEXUS_TLS_CA": str(cert)})
    # Plain text to a TLS server gets no answer.
    monkeypatch.delenv("PLEXUS_TLS_CA", raising=False)
    with pytest.raises(plexus.UnavailableError, match="no Plexus server"):
        plexus.status(server.address)
    client = lab.connect(server.address, tls_ca=str(cert))
    try:
        s = client.slice(1)
        x = s.put(np.arange(8, dtype=np.float32))
        np.testing.assert_array_equal(
            bounded(lambda: np.asarray(s.program("scale", x, factor=2.0)(x)),
                    "a call over TLS"), 2 * np.arange(8))
    finally:
        client.close()
    # The CLI and status (and the lab's shutdown) trust the CA from the
    # environment.
    monkeypatch.setenv("PLEXUS_TLS_CA", str(cert))
    assert len(plexus.status(server.address)["workers"]) == 1
    assert lab.stop() == []

"""Hosts in network namespaces of their own on one machine (as containers or
pods on one Kubernetes node): one kernel and one /etc/machine-id, but the
abstract unix socket of the shared-memory data plane is per namespace.

Every wait here is bounded: before the fix, a slice over two such hosts hung
for good in all_reduce (each worker pushed to the other's unreachable unix
socket, logged a warning, and the consumer waited forever).
"""
import concurrent.futures

import numpy as np
import pytest

import plexus
from netns import NetnsLab

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
    from plexus._api import _decode_status
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
    client = plexus.connect(server.address, name="netns")
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
    client = plexus.connect(server.address, name="netns")
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

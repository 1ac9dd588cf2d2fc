"""Slices against a real cluster: placement on named hosts and away from
other slices, where each virtual device is, and requests that wait at the
server for capacity (granted when a worker registers, refused at their
deadline, dropped when their client leaves) without holding up the client's
other work."""
import os
import select
import subprocess
import threading
import time

import numpy as np
import pytest

import plexus
from plexus._binaries import bin_dir
from plexus.cli import format_status


def hosts_of(s):
    return {d["host"] for d in s.devices}


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """Two hosts of two devices each."""
    log = tmp_path_factory.mktemp("logs") / "cluster.log"
    with plexus.local(hosts=2, devices_per_host=2, log_level="info",
                      log_file=str(log)) as c:
        yield c


@pytest.fixture
def client(four):
    c = four.connect(name="slices")
    yield c
    c.close()


def test_a_slice_on_named_hosts_uses_only_them(four, client):
    s = client.slice(2, hosts=["host1"])
    assert hosts_of(s) == {"host1"}
    # slice.devices says where each virtual device is, in mesh order.
    assert [(d["host"], d["device"]) for d in s.devices] == [("host1", 0),
                                                             ("host1", 1)]
    assert len({d["worker"] for d in s.devices}) == 1
    # ...and so does plexus status.
    st = four.status()
    (mine,) = [x for x in st["slices"] if x["slice_id"] == s.id]
    assert [(d["host_name"], d.get("device", 0), d["worker_id"])
            for d in mine["devices"]] == [(d["host"], d["device"], d["worker"])
                                          for d in s.devices]


def test_a_slice_avoids_the_hosts_of_other_slices(client):
    first = client.slice(1, placement="one_host")
    second = client.slice(2, avoid=[first])
    assert hosts_of(second).isdisjoint(hosts_of(first))
    x = second.put(np.arange(4, dtype=np.float32), plexus.P("devices"))
    np.testing.assert_array_equal(np.asarray(x), np.arange(4, dtype=np.float32))


def test_an_unknown_host_is_refused_at_once_naming_the_known_ones(client):
    t0 = time.monotonic()
    with pytest.raises(plexus.NotFoundError,
                       match=r"no worker registered as 'hots1' \(hosts: host0, host1\)"):
        client.slice(1, hosts=["hots1"], timeout=30)
    assert time.monotonic() - t0 < 5


def test_a_request_that_may_not_wait_fails_at_once(client):
    with pytest.raises(plexus.ResourceExhaustedError,
                       match=r"asked for 3 devices on one host; the largest live "
                             r"host has 2 devices"):
        client.slice(3, placement="one_host", timeout=0)


def test_a_request_times_out_saying_what_it_waited_for(client):
    t0 = time.monotonic()
    deadline_error = getattr(plexus, "DeadlineExceededError", plexus.PlexusError)
    with pytest.raises(deadline_error) as e:
        client.slice(5, timeout=0.3)
    waited = time.monotonic() - t0
    assert "no slice within 300ms: asked for 5 devices; the cluster has 4 " \
           "live devices on 2 hosts; no request ahead" in str(e.value)
    assert 0.25 < waited < 5, waited


def test_a_waiting_request_does_not_hold_up_the_clients_other_work(four, client):
    small = client.slice(2)
    outcome = []
    t = threading.Thread(target=lambda: outcome.append(
        _try(lambda: client.slice(8, timeout=20))))
    t.start()
    try:
        st = four.wait_until(lambda st: st.get("pending_slices"), 10,
                             "the request to wait")
        (p,) = st["pending_slices"]
        assert p["client_id"] == client.id
        assert p["waiting_for"] == ("asked for 8 devices; the cluster has 4 "
                                    "live devices on 2 hosts; no request ahead")
        # `plexus status` shows it, and where each virtual device of the
        # slice it has is.
        text = format_status(st)
        assert "WAITING FOR" in text and p["waiting_for"] in text
        (row,) = [line for line in text.splitlines()
                  if line.split()[:2] == [str(small.id), str(client.id)]]
        d = small.devices[0]
        assert row.split()[3:6] == [d["host"], str(d["worker"]), f"0->{d['device']}"]
        # Meanwhile the same client computes on the slice it has.
        x = small.put(np.arange(4, dtype=np.float32), plexus.P("devices"))
        y = small.program("scale", x, factor=2.0)(x)
        np.testing.assert_array_equal(np.asarray(y),
                                      2 * np.arange(4, dtype=np.float32))
        assert t.is_alive()
    finally:
        client.close()  # the waiting request goes with its client
        t.join(30)
    assert not t.is_alive()
    four.wait_until(lambda st: not st.get("pending_slices"), 10,
                    "the request to be dropped")
    assert isinstance(outcome[0], plexus.PlexusError), outcome
    assert "closed before the server granted the slice" in str(outcome[0])


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the outcome is checked
        return e


def test_a_waiting_request_is_granted_when_a_host_large_enough_registers(
        four, client, tmp_path):
    outcome = []
    t = threading.Thread(target=lambda: outcome.append(
        _try(lambda: client.slice(4, placement="one_host", timeout=60))))
    t.start()
    worker = None
    try:
        st = four.wait_until(lambda st: st.get("pending_slices"), 10,
                             "the request to wait")
        assert st["pending_slices"][0]["waiting_for"].startswith(
            "asked for 4 devices on one host; the largest live host has 2 "
            "devices")
        # A fifth host of four devices joins the cluster.
        read_end, write_end = os.pipe()
        env = dict(os.environ, PLEXUS_CLUSTER_SECRET=four._secret)
        with open(tmp_path / "big.log", "ab") as log:
            worker = subprocess.Popen(
                [str(bin_dir() / "plexus-worker"), "--server", four.address,
                 "--host-name", "big", "--devices", "4", "--die-with-parent",
                 "--ready-fd", str(write_end), "--log-level", "info"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=(write_end,), env=env)
        os.close(write_end)
        ready, _, _ = select.select([read_end], [], [], 30)
        os.close(read_end)
        assert ready, "the worker did not register within 30 s"
        t.join(30)
        assert not t.is_alive(), "the slice was not granted"
        (s,) = outcome
        assert isinstance(s, plexus.Slice), s
        assert hosts_of(s) == {"big"}
        x = s.put(np.arange(8, dtype=np.float32), plexus.P("devices"))
        np.testing.assert_array_equal(np.asarray(x),
                                      np.arange(8, dtype=np.float32))
        s.close()
    finally:
        client.close()
        t.join(30)
        if worker is not None:
            worker.terminate()
            worker.wait(30)


def test_a_request_over_max_devices_waits_for_a_slice_to_be_released(tmp_path):
    # Sessions on loopback with no tenant credential are tenant "default".
    with plexus.local(hosts=2, devices_per_host=2, log_file=str(tmp_path / "log"),
                      tenants={"default": {"max_devices": 3}}) as cluster:
        client = cluster.connect(name="capped")
        with pytest.raises(plexus.ResourceExhaustedError,
                           match=r"tenant 'default' may hold at most 3 .*max_devices"):
            client.slice(4)  # never: refused at once
        first = client.slice(2)
        outcome = []
        t = threading.Thread(target=lambda: outcome.append(
            _try(lambda: client.slice(2, timeout=30))))
        t.start()
        try:
            st = cluster.wait_until(lambda st: st.get("pending_slices"), 10,
                                    "the request to wait")
            assert st["pending_slices"][0]["waiting_for"] == (
                f"asked for 2 devices; client {client.id} holds 2 devices in 1 "
                "slice, and tenant 'default' may hold 3 (max_devices); no "
                "request ahead")
            first.close()
            t.join(30)
            assert not t.is_alive(), "the slice was not granted"
            (s,) = outcome
            assert isinstance(s, plexus.Slice), s
            assert s.num_devices == 2
        finally:
            client.close()
            t.join(30)

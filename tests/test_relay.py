"""Relayed answers (transport/relay_links.h), on a real embedded cluster:
a call made right after a wait goes with Call.relay, and each worker sends
its small outputs on the client's relay link as they are decided, so the
fetch that follows sends no FETCH. Values, errors and a link a client
leaves unread, against the same client without relays."""
import os

import numpy as np
import pytest

import plexus


def worker_stat(cluster, name):
    return sum(int(w["stats"].get(name, 0))
               for w in cluster.status(fresh=True)["workers"])


def connect(cluster, relay):
    """A client with relayed answers on or off ($PLEXUS_RELAY_ANSWERS is
    read as the client connects)."""
    before = os.environ.get("PLEXUS_RELAY_ANSWERS")
    os.environ["PLEXUS_RELAY_ANSWERS"] = "1" if relay else "0"
    try:
        return cluster.connect(name=f"relay-{relay}")
    finally:
        if before is None:
            del os.environ["PLEXUS_RELAY_ANSWERS"]
        else:
            os.environ["PLEXUS_RELAY_ANSWERS"] = before


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_round_trips_answer_comes_on_the_relay_link(cluster, hosts):
    # The first fetch from each worker asks it, then opens the link; every
    # round trip after that is answered on the link (one answer per shard),
    # with the values a fetch gives. A client without relays fetches all.
    rounds = 20
    counts = {}
    for relay in (True, False):
        client = connect(cluster, relay)
        s = client.slice(2 * hosts, hosts=[f"host{h}" for h in range(hosts)])
        # Split: a fetch reads every shard, each answered on its link.
        x = s.put(np.arange(8 * hosts, dtype=np.float32),
                  sharding=("split", 0))
        scale = s.program("scale", x, factor=2.0)
        relayed_before = worker_stat(cluster, "answers_relayed")
        y = x
        want = np.arange(8 * hosts, dtype=np.float32)
        for _ in range(rounds):
            y = scale(y)
            want = want * 2.0
            np.testing.assert_array_equal(np.asarray(y), want)
        c = client.counters()
        counts[relay] = (c["relay_links_opened"], c["answers_relayed"],
                         worker_stat(cluster, "answers_relayed")
                         - relayed_before)
        client.close()
    shards = 2 * hosts
    assert counts[True] == (hosts, (rounds - 1) * shards,
                            (rounds - 1) * shards), counts
    assert counts[False] == (0, 0, 0), counts


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_replicated_value_is_relayed_once(cluster, hosts):
    # A fetch of a replicated value reads one replica, device 0's: a
    # relayed call's workers answer that shard only (Call.relay_first_shard)
    # and only device 0's worker needs a link. Before, every replica was
    # answered, all but one left unread on the links (1 host), and on 2
    # hosts no call was relayed at all (the second host had no link: no
    # fetch ever read from it).
    rounds = 20
    client = connect(cluster, True)
    s = client.slice(2 * hosts, hosts=[f"host{h}" for h in range(hosts)])
    x = s.put(np.arange(8, dtype=np.float32))  # replicated
    scale = s.program("scale", x, factor=2.0)
    relayed_before = worker_stat(cluster, "answers_relayed")
    y, want = x, np.arange(8, dtype=np.float32)
    for _ in range(rounds):
        y = scale(y)
        want = want * 2.0
        np.testing.assert_array_equal(np.asarray(y), want)
    c = client.counters()
    assert (c["relay_links_opened"], c["answers_relayed"],
            worker_stat(cluster, "answers_relayed") - relayed_before) == (
        1, rounds - 1, rounds - 1)
    # A wait reads every replica. Client::Wait takes device 0's relayed
    # answer (left for the fetch) and asks the others' workers, which opens
    # their links; it never waits on a link for a replica not relayed (it
    # would, 30 s, then drop the link: a link opened again). plexus's
    # block_until_ready asks every worker. Still one answer per call.
    relayed_before = worker_stat(cluster, "answers_relayed")
    for i in range(6):
        y = scale(y)
        want = want * 2.0
        if i % 2:
            y.block_until_ready()
        else:
            client._core.wait(y._f)
        np.testing.assert_array_equal(np.asarray(y), want)
    assert client.counters()["relay_links_opened"] == hosts
    assert worker_stat(cluster, "answers_relayed") - relayed_before == 6
    client.close()


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_wait_reads_the_relay_links(cluster, hosts):
    # plexus.wait / block_until_ready (the JAX idiom: f(x).block_until_ready())
    # of a relayed call's outputs reads their answers on the links, as a
    # fetch does, and the values stay there for the fetch that may follow;
    # a wait answered by a worker opens its link. Before, a wait asked every
    # worker and opened no link: a loop of waits alone was never relayed,
    # and one after a fetch left every answer unread on the link.
    rounds = 20
    client = connect(cluster, True)
    s = client.slice(2 * hosts, hosts=[f"host{h}" for h in range(hosts)])
    x = s.put(np.arange(8 * hosts, dtype=np.float32), sharding=("split", 0))
    scale = s.program("scale", x, factor=2.0)
    shut_before = worker_stat(cluster, "relay_links_shut")
    y = x
    for _ in range(rounds):
        y = scale(y)
        y.block_until_ready()
    shards = 2 * hosts
    c = client.counters()
    assert (c["relay_links_opened"], c["answers_relayed"]) == (
        hosts, (rounds - 1) * shards)
    np.testing.assert_array_equal(
        np.asarray(y), np.arange(8 * hosts, dtype=np.float32) * 2.0 ** rounds)
    assert client.counters()["answers_relayed"] == rounds * shards
    assert worker_stat(cluster, "relay_links_shut") == shut_before
    client.close()


def test_a_relayed_wait_that_times_out_keeps_the_link(cluster):
    # A wait with a timeout on a relayed call still running says which host
    # did not confirm it by then, and leaves the link for the answer still
    # due: the next wait reads it there, no link opened again.
    client = connect(cluster, True)
    s = client.slice(1)
    x = s.put(np.ones(4, np.float32))
    # A second of work: far past the wait's 10 ms, on any machine's load.
    busy = s.program("busy_wait", x, micros=1_000_000)
    scale = s.program("scale", x, factor=1.0)
    np.testing.assert_array_equal(np.asarray(scale(x)), 1.0)  # opens it
    y = busy(x)  # relayed
    with pytest.raises(plexus.DeadlineExceededError,
                       match=r"1 of 1 futures not ready by the deadline "
                             r"\(not confirmed ready by host host\d"):
        plexus.wait(y, timeout=0.01)
    relayed = client.counters()["answers_relayed"]
    plexus.wait(y)
    np.testing.assert_array_equal(np.asarray(y), 1.0)
    c = client.counters()
    assert c["relay_links_opened"] == 1
    assert c["answers_relayed"] == relayed + 2  # the wait's, the fetch's
    client.close()


def test_a_relayed_calls_failure_keeps_its_message(cluster):
    # A program that fails on the worker: its error comes on the link, code
    # and message as a fetch would have them; the next round trip is
    # relayed again.
    client = connect(cluster, True)
    s = client.slice(1)
    check = s.program("assert_finite", plexus.Spec((4,), "float32"),
                      name="check")
    ok = s.put(np.array([1, 2, 3, 4], np.float32))
    bad = s.put(np.array([1, 2, np.nan, 4], np.float32))
    np.testing.assert_array_equal(np.asarray(check(ok)), [1, 2, 3, 4])
    assert client.counters()["relay_links_opened"] == 1
    with pytest.raises(plexus.PlexusError,
                       match="program 'check' failed.*non-finite value nan "
                             "at index 2"):
        np.asarray(check(bad))
    np.testing.assert_array_equal(np.asarray(check(ok)), [1, 2, 3, 4])
    assert client.counters()["answers_relayed"] == 2
    client.close()


def test_relayed_values_left_unread_shut_the_link_not_the_worker(cluster):
    # Calls made right after a wait whose 16 KiB outputs nobody fetches:
    # their answers pile up on the link until the client's socket cannot
    # take one, and the worker shuts the link rather than wait. Every value
    # is still there to fetch, and the next fetch opens a new link.
    client = connect(cluster, True)
    s = client.slice(1)
    x = s.put(np.ones(4096, np.float32))  # 16 KiB: the largest relayed
    scale = s.program("scale", x, factor=3.0)
    np.testing.assert_array_equal(np.asarray(scale(x)), 3.0)  # opens it
    shut_before = worker_stat(cluster, "relay_links_shut")
    unread = []
    for _ in range(200):  # a unix socket takes some tens of them
        unread.append(scale(x))
        x.block_until_ready()  # a wait (direct: x is a put)
        if worker_stat(cluster, "relay_links_shut") > shut_before:
            break
    assert worker_stat(cluster, "relay_links_shut") == shut_before + 1
    for y in unread:
        np.testing.assert_array_equal(np.asarray(y), 3.0)
    np.testing.assert_array_equal(np.asarray(scale(x)), 3.0)
    assert client.counters()["relay_links_opened"] == 2
    client.close()


def test_a_graphs_calls_are_not_relayed(cluster):
    # A graph records its calls made after a wait in one batch; most of
    # their outputs are read by the next call only, so none is relayed
    # (relayed, they piled up unread on the link in the examples' training
    # loops). A call made alone after the graph's fetch is.
    client = connect(cluster, True)
    s = client.slice(1)
    x = s.put(np.ones(4, np.float32))
    scale = s.program("scale", x, factor=2.0)
    np.testing.assert_array_equal(np.asarray(scale(x)), 2.0)  # opens it
    with client.graph():
        y = scale(scale(scale(x)))
    np.testing.assert_array_equal(np.asarray(y), 8.0)
    assert client.counters()["answers_relayed"] == 0
    np.testing.assert_array_equal(np.asarray(scale(y)), 16.0)
    assert client.counters()["answers_relayed"] == 1
    client.close()

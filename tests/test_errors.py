"""Bad input gets a clear error naming what is wrong, and nothing dies."""
import os
import signal

import numpy as np
import pytest

import plexus


def test_shape_mismatch_names_program_argument_and_both_shapes(client):
    s = client.slice(2)
    prog = s.program("scale", plexus.Spec((4,), "float32"), name="halve",
                     factor=0.5)
    wrong = s.put(np.zeros(5, np.float32))
    with pytest.raises(plexus.InvalidArgumentError) as e:
        prog(wrong)
    msg = str(e.value)
    assert "program 'halve'" in msg and "argument 0" in msg
    assert "float32[5]" in msg and "float32[4]" in msg


def test_numpy_argument_of_the_wrong_shape_is_rejected(client):
    s = client.slice(1)
    prog = s.program("relu", plexus.Spec((3,), "float32"))
    with pytest.raises(plexus.InvalidArgumentError, match=r"float32\[2\].*float32\[3\]"):
        prog(np.zeros(2, np.float32))


def test_a_wrong_argument_count_names_the_program_and_both_counts(client):
    s = client.slice(1)
    add = s.program("add", plexus.Spec((3,), "float32"),
                    plexus.Spec((3,), "float32"), name="sum2")
    x = s.put(np.zeros(3, np.float32))
    for args, got in (((x,), 1), ((x, x, x), 3),
                      ((np.zeros(3, np.float32),), 1)):
        # The message is the server's rule (common/argument_count.h), met
        # before anything is put or sent.
        with pytest.raises(plexus.InvalidArgumentError,
                           match=f"^program 'sum2' takes 2 arguments, "
                                 f"got {got}$"):
            add(*args)
    assert np.asarray(add(x, x)).tolist() == [0, 0, 0]  # the program works


def test_unknown_kernel_lists_the_known_ones(client):
    s = client.slice(1)
    with pytest.raises(plexus.NotFoundError, match="unknown kernel 'conv9d'.*matmul"):
        s.program("conv9d", plexus.Spec((3,)))


def test_kernel_shape_rules_fail_at_compile_time(client):
    s = client.slice(1)
    with pytest.raises(plexus.InvalidArgumentError, match=r"float32\[3, 4\].*float32\[5, 2\]|\[5, 2\].*\[3, 4\]"):
        s.program("matmul", plexus.Spec((3, 4)), plexus.Spec((5, 2)))


def test_runtime_failure_raises_the_workers_message_and_worker_keeps_serving(client):
    s = client.slice(2)
    check = s.program("assert_finite", plexus.Spec((4,), "float32"),
                      name="check")
    bad = s.put(np.array([1, 2, np.nan, 4], np.float32))
    failed = check(bad)
    with pytest.raises(plexus.PlexusError, match="program 'check' failed.*non-finite value nan at index 2"):
        np.asarray(failed)
    # A call that depends on the failed one fails with the same message.
    double = s.program("scale", plexus.Spec((4,), "float32"), factor=2.0)
    with pytest.raises(plexus.PlexusError, match="non-finite value nan"):
        double(failed).block_until_ready()
    # The same workers still compute.
    ok = s.put(np.array([1, 2, 3, 4], np.float32))
    np.testing.assert_array_equal(np.asarray(double(check(ok))), [2, 4, 6, 8])


def test_uneven_split_is_rejected_with_the_axis_length(client):
    s = client.slice(4)
    with pytest.raises(plexus.InvalidArgumentError, match="length 6.*4 devices"):
        s.put(np.zeros(6, np.float32), plexus.P("devices"))


def test_partition_spec_over_an_unknown_axis(client):
    s = client.slice(2, mesh=(2,), axis_names=("data",))
    with pytest.raises(ValueError, match="'model'"):
        s.put(np.zeros(4, np.float32), plexus.P("model"))


def test_slice_larger_than_the_cluster(client):
    # timeout=0: refused at once rather than waiting for more hosts.
    with pytest.raises(plexus.ResourceExhaustedError, match="4 live devices on 2 hosts"):
        client.slice(9, timeout=0)


def test_mesh_shape_must_match_the_slice(client):
    # Bad input, not a lack of devices: the server's code reaches Python.
    with pytest.raises(plexus.InvalidArgumentError, match=r"mesh shape \[3\] holds .*the slice has 2"):
        client.slice(2, mesh=(3,))


@pytest.mark.parametrize("n", [0, -3])
def test_slice_of_no_devices_is_invalid(client, n):
    with pytest.raises(plexus.InvalidArgumentError,
                       match=f"at least 1 device, asked for {n}"):
        client.slice(n)


def test_a_slice_that_lost_a_host_is_unavailable(tmp_path):
    # The server refuses calls on a slice whose worker died with UNAVAILABLE;
    # the code travels with the error to the client (and to the workers that
    # hold the call's outputs), so Python raises UnavailableError. (The
    # SIGKILLed worker is reported again when the cluster goes down.)
    with pytest.raises(plexus.ClusterExitError, match=r"SIGKILL"), \
            plexus.local(hosts=2, devices_per_host=1, log_level="info",
                         log_file=str(tmp_path / "log")) as cluster:
        client = cluster.connect()
        s = client.slice(2, placement="spread")
        ones = s.program("fill", shape=[4], value=1.0, name="ones")
        np.testing.assert_array_equal(np.asarray(ones()), np.ones(4))
        # Kill the host that does not hold shard 0, which a fetch of this
        # replicated value reads: the fetch reaches a live worker.
        lost = s.devices[1]["host"]
        assert lost != s.devices[0]["host"]
        victim = next(w for w in cluster.status()["workers"]
                      if w["host_name"] == lost)
        os.kill(int(victim["pid"]), signal.SIGKILL)
        cluster.wait_until(lambda st: any(not w["alive"] for w in st["workers"]),
                           what="the server to mark the worker down")
        with pytest.raises(plexus.UnavailableError,
                           match=r"program 'ones': slice \d+ lost a host"):
            np.asarray(ones())


def test_buffer_that_can_never_fit_is_refused(tmp_path):
    with plexus.local(hosts=1, devices_per_host=1, device_memory_mib=1,
                      log_file=str(tmp_path / "log")) as cluster:
        client = cluster.connect()
        s = client.slice(1)
        with pytest.raises(plexus.ResourceExhaustedError, match="budget"):
            s.put(np.zeros(1 << 20, np.float32))
        with pytest.raises(plexus.ResourceExhaustedError, match="budget"):
            s.program("fill", shape=[1 << 19], value=1.0)
        # Buffers that fit one at a time keep flowing as futures are dropped.
        x = s.put(np.ones(1 << 16, np.float32))          # 256 KiB
        step = s.program("scale", x, factor=1.0)
        for _ in range(40):                                # 10 MiB in total
            x = step(x)
        np.testing.assert_array_equal(np.asarray(x), np.ones(1 << 16, np.float32))


def test_absurd_shape_is_refused_not_overflowed(client):
    s = client.slice(1)
    with pytest.raises(plexus.InvalidArgumentError, match="more than 2\\^50 elements"):
        s.program("fill", shape=[1 << 40, 1 << 40], value=1.0)
    with pytest.raises(plexus.InvalidArgumentError, match="more than 2\\^50 elements"):
        s.program("relu", plexus.Spec((1 << 30, 1 << 30, 8)))


def test_a_failed_call_keeps_its_class_on_another_host(client):
    # The failure reaches the consumer's worker over the data plane (a
    # transfer of the failed value), its code with it.
    a = client.slice(1, placement="one_host")
    b = client.slice(1, placement="one_host")
    assert a.devices[0]["host"] != b.devices[0]["host"]
    check = a.program("assert_finite", plexus.Spec((2,), "float32"),
                      name="check")
    failed = check(a.put(np.array([1, np.inf], np.float32)))
    double = b.program("scale", plexus.Spec((2,), "float32"), factor=2.0)
    with pytest.raises(plexus.InvalidArgumentError,
                       match="program 'check' failed.*non-finite value inf"):
        np.asarray(double(failed))

"""Priorities against a real cluster (tenants' "priority", set by the
operator): a higher-priority client's slice takes two hosts from a
lower-priority data-parallel training job, which goes on smaller without
restarting (its values moved, none lost), and grows back when the
higher-priority client leaves. Every step matches one process applying
the same steps with the same batch sizes."""
import json
import time

import numpy as np
import pytest

import plexus

WAIT_S = 60
TENANTS = {"tenants": {"prod": {"priority": 10}, "batch": {}}}


def hosts_of(s):
    return {d["host"] for d in s.devices}


@pytest.mark.jax_heavy
def test_a_higher_priority_takes_two_hosts_and_gives_them_back(tmp_path):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rows, lr, steps, features, hidden = 4, 0.1, 6, 4, 8
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((steps, 4 * rows, features)).astype(np.float32)
    ts = rng.standard_normal((steps, 4 * rows)).astype(np.float32)
    sizes_p = [features * hidden, hidden, hidden, 1]

    def loss(p, x, t):  # a sum: the step divides by its batch
        w1, b1, w2, b2 = jnp.split(p, np.cumsum(sizes_p)[:-1])
        y = jnp.tanh(x @ w1.reshape(features, hidden) + b1) @ w2 + b2[0]
        return jnp.sum((y - t) ** 2)

    step_grad = jax.jit(jax.grad(loss))
    want = (rng.standard_normal(sum(sizes_p)) * 0.3).astype(np.float32)
    with plexus.local(hosts=4, tenants=TENANTS) as cluster:
        low = cluster.connect(name="trainer", tenant="batch")
        s = low.slice(4, placement="spread", on_loss="shrink",
                      min_devices=2, grow=True)
        grad = plexus.jit(jax.grad(loss), s, name="island_grad",
                          in_shardings=(None, plexus.split(0),
                                        plexus.split(0)),
                          out_shardings=plexus.partial())
        update = plexus.jit(lambda p, g, scale: p - scale * g, s,
                            name="update")
        p = s.put(want)
        sizes, retried, handover = [], 0, {}
        high = hs = None
        with low.trace(str(tmp_path / "trace.json")):
            k = 0
            while k < steps:
                if k == 2 and high is None:
                    # The urgent job arrives between steps.
                    high = cluster.connect(name="urgent", tenant="prod")
                    before, t0 = s.resizes, time.monotonic()
                    hs = high.slice(2, placement="spread")
                    cluster.wait_until(lambda _: s.resizes > before,
                                       timeout=WAIT_S,
                                       what="the trainer to yield 2 hosts")
                    plexus.wait(p, timeout=WAIT_S)  # its moved parameters
                    handover["yield_s"] = time.monotonic() - t0
                    assert s.num_devices == 2, s
                    assert not hosts_of(s) & hosts_of(hs), (s.devices,
                                                            hs.devices)
                    # The urgent job runs on the hosts it took.
                    x = hs.put(np.arange(8, dtype=np.float32), plexus.split(0))
                    np.testing.assert_array_equal(
                        np.asarray(plexus.wait(x * 2, timeout=WAIT_S)),
                        np.arange(8, dtype=np.float32) * 2)
                if k == 4 and hs is not None:
                    before, t0 = s.resizes, time.monotonic()
                    high.close()  # leaves: its hosts come back
                    hs = None
                    cluster.wait_until(lambda _: s.num_devices == 4,
                                       timeout=WAIT_S,
                                       what="the trainer to grow back to 4")
                    plexus.wait(p, timeout=WAIT_S)
                    handover["grow_s"] = time.monotonic() - t0
                n, resizes = s.num_devices, s.resizes
                all_reduce = s.program(
                    "all_reduce",
                    plexus.Spec((sum(sizes_p),), "float32", plexus.partial()))
                x_k, t_k = xs[k][:rows * n], ts[k][:rows * n]
                try:
                    x = s.put(x_k, plexus.split(0))
                    t = s.put(t_k, plexus.split(0))
                    scale = s.put(np.float32(lr / (rows * n)))
                    new_p = update(p, all_reduce(grad(p, x, t)), scale)
                    got = np.asarray(plexus.wait(new_p, timeout=WAIT_S))
                except plexus.PlexusError as e:
                    # A resize under the step: run it again on the new size.
                    assert s.resizes != resizes, f"step {k} failed: {e}"
                    retried += 1
                    continue
                if s.resizes != resizes:
                    retried += 1
                    continue
                want = want - np.float32(lr / (rows * n)) * np.asarray(
                    step_grad(want, x_k, t_k))
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
                sizes.append(n)
                p = new_p
                k += 1
        trace = json.loads((tmp_path / "trace.json").read_text())
        st = cluster.status()
    assert sizes == [4, 4, 2, 2, 4, 4], sizes
    names = [e["name"] for e in trace["traceEvents"]
             if e.get("cat") == "resize" and e["ph"] == "b"]
    assert any("shrank from 4 to 2 devices: it gave 2 to slice" in n and
               "tenant 'prod' (priority 10, over 0)" in n
               for n in names), names
    assert any("grew back to 4" in n for n in names), names
    counters = st.get("recovery", {})
    assert int(counters.get("slices_yielded", 0)) == 1, counters
    print("\n".join(f"resize: {n}" for n in names))
    print(f"priority hand-over: yield {handover['yield_s'] * 1e3:.0f} ms, "
          f"grow back {handover['grow_s'] * 1e3:.0f} ms; "
          f"sizes {sizes}; steps run again {retried}")


def test_a_bad_priority_is_refused_naming_the_tenant():
    # The server cannot start with it, and says why on its ready pipe:
    # plexus.local raises that, by its code.
    with pytest.raises(plexus.InvalidArgumentError,
                       match=r"plexus-server cannot start: .*tenants: "
                       r"prod.priority must be an integer from -1000 to 1000"):
        with plexus.local(hosts=1,
                          tenants={"tenants": {"prod": {"priority": "high"}}}):
            pass

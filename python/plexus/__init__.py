"""Plexus: a single-controller, asynchronous, distributed dataflow runtime.

    import numpy as np, plexus
    with plexus.local(hosts=2, devices_per_host=1) as cluster:
        client = cluster.connect()
        s = client.slice(2)
        x = s.put(np.arange(8, dtype=np.float32), plexus.P("devices"))
        double = s.program("scale", x, factor=2.0)
        print(np.asarray(double(x)))
"""
from ._core import (DeadlineExceededError, DeviceLostError, InvalidArgumentError, NotFoundError,
                    PermissionDeniedError, PlexusError, ResourceExhaustedError,
                    ServerRestartedError, UnavailableError, UnimplementedError)
from ._api import Client, Slice, connect, status
from ._future import Future, block_until_ready, wait
from ._program import Graph, Program, Spec
from ._sharding import P, partial, replicated, split
from ._builtins import builtins
from ._cluster import ClusterExitError, LocalCluster, local
from ._jit import jit
from . import pipeline, rl  # noqa: E402 - libraries over the API above

__all__ = [
    "Client", "ClusterExitError", "Future", "Graph", "LocalCluster", "P", "Program", "Slice",
    "Spec", "block_until_ready", "builtins", "connect", "jit", "local", "partial",
    "replicated", "split", "status", "wait",
    "PlexusError", "InvalidArgumentError", "NotFoundError",
    "PermissionDeniedError", "ResourceExhaustedError", "UnavailableError",
    "DeadlineExceededError", "DeviceLostError", "ServerRestartedError",
    "UnimplementedError", "pipeline", "rl",
]

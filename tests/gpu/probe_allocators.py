#!/usr/bin/env python3
"""Which of the CUDA plugin's allocators gives memory that legacy CUDA IPC
(cudaIpcGetMemHandle, what worker/cuda_ipc.h uses) can export: for each
XLA_PYTHON_CLIENT_ALLOCATOR (default, platform, bfc, cuda_async), a
subprocess makes a 64 MiB array with in-process JAX and asks the driver
about its allocation (cuPointerGetAttribute: IS_LEGACY_CUDA_IPC_CAPABLE,
ALLOWED_HANDLE_TYPES, MEMPOOL_HANDLE). Prints one line per allocator and
writes --json. GPU machine only:
    python3 tests/gpu/probe_allocators.py --json $OUT/allocators.json"""
import argparse
import json
import os
import subprocess
import sys

CHILD = r'''
import ctypes, json, os
import jax, jax.numpy as jnp
x = jnp.arange((64 << 20) // 4, dtype=jnp.float32) + 1.0
x.block_until_ready()
ptr = x.unsafe_buffer_pointer()
cuda = ctypes.CDLL("libcuda.so.1")
def attr(kind, ctype):
    v = ctype(0)
    rc = cuda.cuPointerGetAttribute(ctypes.byref(v), ctypes.c_int(kind),
                                    ctypes.c_uint64(ptr))
    return rc, v.value
out = {}
for name, kind, ctype in (("legacy_ipc_capable", 10, ctypes.c_int),
                          ("allowed_handle_types", 14, ctypes.c_uint64),
                          ("mempool_handle", 17, ctypes.c_uint64),
                          ("mapping_size", 18, ctypes.c_uint64)):
    rc, v = attr(kind, ctype)
    out[name] = v if rc == 0 else f"error {rc}"
print(json.dumps(out))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = {}
    for allocator in ("default", "platform", "bfc", "cuda_async"):
        env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
        if allocator != "default":
            env["XLA_PYTHON_CLIENT_ALLOCATOR"] = allocator
        r = subprocess.run([sys.executable, "-c", CHILD], env=env,
                           capture_output=True, text=True, timeout=120)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        try:
            results[allocator] = json.loads(line)
        except ValueError:
            results[allocator] = {"error": (r.stderr or r.stdout)[-400:]}
        print(f"[allocators] {allocator:10s} {results[allocator]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

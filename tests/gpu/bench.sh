#!/usr/bin/env bash
# The GPU figures of device memory (issue 9) in one run, under 5 minutes on
# one NVIDIA GPU, beside in-process JAX on the same machine:
#   - chained 8192x8192 f32 matmuls through Plexus and JAX (goal: Plexus
#     within 5% of JAX);
#   - a ~0.55 ms program (rounds of tanh(x @ w), 2048x2048), chained
#     (goal: within 10%), the tiny and 64 MiB programs, the built-in floor;
#   - a 1 GiB value moved between two workers sharing the GPU, by CUDA IPC
#     and host-staged (two clusters, the second with CUDA IPC off), with
#     the path each took, beside the hardware's own copies.
# The GPU tests themselves (tests/gpu) run before it in the bundle's
# run.sh; this script only measures.
#
#   bash tests/gpu/bench.sh [out-dir]           on the GPU machine (its
#                                               run.sh sets the plugin)
#   PLATFORM=cpu bash tests/gpu/bench.sh /tmp/x the rehearsal on CPU, with
#                                               sizes that fit a 2-core VM
# Writes out-dir/xla_<platform>.json and device_transfer_<platform>.json and
# prints a summary; exits non-zero when a step failed.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-${OUT:-$root/bench/results}}"
mkdir -p "$out"
cd "$root"
PY="${PYTHON:-python3}"
export PYTHONPATH="${PYTHONPATH:-$root/python}"
export PLEXUS_BIN_DIR="${PLEXUS_BIN_DIR:-$root/build/bin}"
if [ -z "${PLATFORM:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then PLATFORM=cuda; else PLATFORM=cpu; fi
fi
plugin_args=()
if [ "$PLATFORM" = cuda ]; then
  [ -n "${PLEXUS_PJRT_PLUGIN:-}" ] || { echo "PLEXUS_PJRT_PLUGIN is not set (the CUDA plugin)"; exit 3; }
  plugin_args=(--plugin "$PLEXUS_PJRT_PLUGIN")
  # JAX in this process must not take the GPU the workers share.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  matmul=8192 heavy_n=2048 transfer_mib=1024
else
  matmul=1024 heavy_n=256 transfer_mib=256
fi
start=$(date +%s)
step() { echo "[gpu-bench $(( $(date +%s) - start ))s] $*"; }
rc=0

step "XLA programs on $PLATFORM: matmul ${matmul}, ~0.55 ms program at ${heavy_n}"
timeout 200 "$PY" bench/xla.py --platform "$PLATFORM" "${plugin_args[@]}" \
  --calls 200 --repeats 5 --heavy-n "$heavy_n" --heavy-ms 0.55 --big-mib 64 \
  --matmul "$matmul" --json "$out/xla_$PLATFORM.json" || rc=1

step "a ${transfer_mib} MiB value between two workers sharing one device, by each path"
timeout 180 "$PY" bench/device_transfer.py --platform "$PLATFORM" \
  "${plugin_args[@]}" --mib "$transfer_mib" --repeats 3 \
  --json "$out/device_transfer_$PLATFORM.json" || rc=1

step "summary"
"$PY" - "$out" "$PLATFORM" <<'EOF' || rc=1
import json, sys
from pathlib import Path
out, platform = Path(sys.argv[1]), sys.argv[2]
xla = json.loads((out / f"xla_{platform}.json").read_text())
tr = json.loads((out / f"device_transfer_{platform}.json").read_text())
def ms(s): return f"{s * 1e3:.3f} ms"
mm = xla.get("matmul", {})
rows = []
if mm:
    rows.append((f"{mm['n']}x{mm['n']} matmul, chained", ms(mm["plexus"]["chained_s"]),
                 ms(mm["jax"]["chained_s"]) if "jax" in mm else "-",
                 f"{mm.get('ratio_chained_s', float('nan')):.3f}", "1.05"))
for name, goal in (("heavy", "1.10"), ("tiny", "-"), ("big", "-")):
    c = xla["cases"].get(name)
    if c:
        rows.append((f"{name} chained", ms(c["plexus"]["chained_s"]),
                     ms(c["jax"]["chained_s"]) if "jax" in c else "-",
                     f"{c.get('ratio_chained_s', float('nan')):.3f}", goal))
print(f"machine: {xla['machine']}; platform {platform}; heavy = "
      f"{xla['heavy_rounds']} rounds at n={xla['heavy_n']}")
print(f"{'program':28s} {'plexus':>12s} {'jax':>12s} {'ratio':>7s} {'goal':>5s}")
for r in rows:
    print(f"{r[0]:28s} {r[1]:>12s} {r[2]:>12s} {r[3]:>7s} {r[4]:>5s}")
for key, name in (("transfer", "fastest path"),
                  ("transfer_host_staged", "host-staged")):
    t = tr.get(key)
    if t:
        print(f"{tr['mib']} MiB between two workers, {name}: {ms(t['s'])}, "
              f"{t['gb_per_s']:.2f} GB/s, paths {t['paths']}")
if not tr.get("ipc_available"):
    print("  CUDA IPC: unavailable here (both runs host-staged)")
for k, v in tr["hardware"].items():
    print(f"  hardware {k[:-2].replace('_', ' ')}: {ms(v['s'])}, {v['gb_per_s']:.2f} GB/s")
EOF
step "done (rc=$rc): figures in $out"
exit $rc

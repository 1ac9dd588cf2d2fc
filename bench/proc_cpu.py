"""What each thread of a process has cost so far, read from /proc (Linux):
the benches take two readings around a measure and divide by its count."""
import os


def _threads(pid):
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def thread_cpu_ns(pid):
    """{(tid, name): CPU ns run} of each thread of `pid` (empty off Linux)."""
    out = {}
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[(tid, name)] = int(f.read().split()[0])
        except OSError:  # the thread ended meanwhile
            continue
    return out


def thread_switches(pid):
    """{(tid, name): context switches (voluntary + involuntary)} of each
    thread of `pid`: each is a sleep and a wake-up, which on a small VM
    costs more CPU than the work a small message needs."""
    out = {}
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            n = 0
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if "ctxt_switches" in line:
                        n += int(line.split()[1])
            out[(tid, name)] = n
        except OSError:
            continue
    return out


class ProcessCost:
    """CPU µs and context switches per operation of each process in `pids`
    ({role: pid}) between start() and stop(n), with the threads' share by
    name."""

    def __init__(self, pids):
        self.pids = pids

    def start(self):
        self.cpu = {r: thread_cpu_ns(p) for r, p in self.pids.items()}
        self.sw = {r: thread_switches(p) for r, p in self.pids.items()}

    def stop(self, n):
        out = {}
        for role, pid in self.pids.items():
            cpu, sw = {}, {}
            for key, ns in thread_cpu_ns(pid).items():
                cpu[key[1]] = cpu.get(key[1], 0) + ns - self.cpu[role].get(
                    key, 0)
            for key, k in thread_switches(pid).items():
                sw[key[1]] = sw.get(key[1], 0) + k - self.sw[role].get(key, 0)
            out[role] = {
                "cpu_us": sum(cpu.values()) / n / 1e3,
                "switches": sum(sw.values()) / n,
                "threads": {name: [round(cpu.get(name, 0) / n / 1e3, 1),
                                   round(sw.get(name, 0) / n, 2)]
                            for name in sorted(set(cpu) | set(sw),
                                               key=lambda t: -cpu.get(t, 0))
                            if cpu.get(name, 0) / n >= 500 or
                            sw.get(name, 0) / n >= 0.1},
            }
        return out

"""What each process and each of its threads has cost so far (Linux): the
benches take two readings around a measure and divide by its count.

A process's total comes from its CPU-time clock (clock_gettime of the
clock id clock_getcpuclockid(3) makes for a pid), which the kernel brings up
to date when read. A thread's share comes from /proc/PID/task/TID/schedstat,
which is brought up to date only when the thread is scheduled or at a timer
tick: a thread running while it is read (the reader itself, a thread busy on
the other core) lags by up to a tick (4 ms here), so over a window of a few
milliseconds the shares are approximate and only the totals are exact (a
20 ms chained run once read 18.8 µs per call for a client that used 10).
"""
import os
import threading
import time


def _threads(pid):
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def process_cpu_ns(pid):
    """CPU ns run by all threads of `pid`, ended ones included (exact; None
    when the process is gone or its clock cannot be read)."""
    try:
        # clock_getcpuclockid(pid): CPUCLOCK_SCHED (2) of process `pid`.
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except (OSError, OverflowError):
        return None


def thread_cpu_ns(pid):
    """{(tid, name): CPU ns run} of each thread of `pid` (empty off Linux);
    the calling thread's own exact, the others' as schedstat has them."""
    out = {}
    me = str(threading.get_native_id()) if pid == os.getpid() else None
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            if tid == me:
                out[(tid, name)] = time.thread_time_ns()
                continue
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[(tid, name)] = int(f.read().split()[0])
        except OSError:  # the thread ended meanwhile
            continue
    return out


def total_ns(pid, threads):
    """The process's CPU ns: its clock's, else the sum of `threads`."""
    ns = process_cpu_ns(pid)
    return sum(threads.values()) if ns is None else ns


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
        self.total = {r: total_ns(p, self.cpu[r]) for r, p in self.pids.items()}
        self.sw = {r: thread_switches(p) for r, p in self.pids.items()}

    def stop(self, n):
        out = {}
        for role, pid in self.pids.items():
            cpu, sw = {}, {}
            threads = thread_cpu_ns(pid)
            total = total_ns(pid, threads) - self.total[role]
            for key, ns in threads.items():
                cpu[key[1]] = cpu.get(key[1], 0) + ns - self.cpu[role].get(
                    key, 0)
            for key, k in thread_switches(pid).items():
                sw[key[1]] = sw.get(key[1], 0) + k - self.sw[role].get(key, 0)
            out[role] = {
                "cpu_us": total / n / 1e3,
                "switches": sum(sw.values()) / n,
                "threads": {name: [round(cpu.get(name, 0) / n / 1e3, 1),
                                   round(sw.get(name, 0) / n, 2)]
                            for name in sorted(set(cpu) | set(sw),
                                               key=lambda t: -cpu.get(t, 0))
                            if cpu.get(name, 0) / n >= 500 or
                            sw.get(name, 0) / n >= 0.1},
            }
        return out

"""How many threads TVM's CPU thread pool runs: one per physical core this process may use.

Without TVM_NUM_THREADS (or OMP_NUM_THREADS) the TVM runtime takes half of std::thread::hardware_concurrency() on
x86, assuming two hyper-threads a core. On a machine without SMT that halves the parallel CPU kernels' speed (this
2-core VM ran every TVM CPU kernel on one thread: gate/up at 64 tokens 103 -> 52 ms with both cores,
docs/performance.md). The pool reads the variable once, when it starts (the first parallel call), so wide_tvm sets
it on import, counting the physical cores of the CPUs in this process's affinity mask from sysfs.
"""

from __future__ import annotations

import os

ENV = "TVM_NUM_THREADS"


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (SMT siblings counted once)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))  # no topology (a container without sysfs): count the CPU itself
    return max(1, len(cores))


def use_physical_cores() -> None:
    """Set TVM_NUM_THREADS to physical_cores() unless the user set it (or OMP_NUM_THREADS, which TVM also reads)."""
    if ENV not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        os.environ[ENV] = str(physical_cores())

"""Peak resident memory of this process, as the run reports it per rank and per checkpoint."""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """This process's own peak resident set size.

    Linux's VmHWM belongs to the address space, which exec replaces, so it covers this program
    only; `ru_maxrss` survives exec and would report the peak of whatever process started us
    (a test runner or a launcher that once held a large buffer). ru_maxrss is the fallback where
    /proc is absent.
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

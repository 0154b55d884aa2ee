"""Where the GPU waits: idle gaps in a torch.profiler Chrome trace, each blamed on the host work that
launched the kernel ending it.

    python -m bench.trace_gaps TRACE.json[.gz] [--min-gap-us 20]

For every gap between consecutive kernels/copies on the device (longer than --min-gap-us), the kernel after
the gap is matched to its launch (the runtime call with the same correlation id), and the launch to the
innermost named range (`record_function` stage) and CPU op around it. The report sums gaps by that
(stage, op) pair: the host work the GPU waited for. Device busy time is the union of kernel intervals.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATS = {"cpu_op", "user_annotation", "python_function"}


def load(path: str | Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _enclosing(host: list[dict], starts: list[float], ts: float, cat: str) -> str:
    """Innermost event of category `cat` whose span holds ts (host sorted by start)."""
    best, best_dur = "-", float("inf")
    for e in host[: bisect.bisect_right(starts, ts)][::-1][:4000]:  # recent starts first; bounded walk
        if e["cat"] == cat and e["ts"] <= ts <= e["ts"] + e.get("dur", 0) and e.get("dur", 0) < best_dur:
            best, best_dur = e["name"], e["dur"]
    return best


def summarize(events: list[dict], min_gap_us: float = 20.0, top: int = 25) -> str:
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATS and "dur" in e), key=lambda e: e["ts"])
    if not device:
        return "no device events in the trace\n"
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    host = sorted((e for e in events if e.get("cat") in HOST_CATS and "dur" in e), key=lambda e: e["ts"])
    starts = [e["ts"] for e in host]
    busy, end = 0.0, device[0]["ts"]
    blame: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for e in device:
        gap = e["ts"] - end
        if gap > min_gap_us:
            launch = launches.get(e.get("args", {}).get("correlation"))
            key = ("?", "?") if launch is None else (
                _enclosing(host, starts, launch["ts"], "user_annotation"),
                _enclosing(host, starts, launch["ts"], "cpu_op"))
            blame[key][0] += gap
            blame[key][1] += 1
        busy += max(0.0, e["ts"] + e["dur"] - max(end, e["ts"]))
        end = max(end, e["ts"] + e["dur"])
    span = end - device[0]["ts"]
    lead = device[0]["ts"] - host[0]["ts"] if host else 0.0
    lines = [f"host start -> first kernel {lead / 1e3:.1f} ms; device span {span / 1e3:.1f} ms, busy {busy / 1e3:.1f} ms ({busy / span:.0%}), "
             f"idle {(span - busy) / 1e3:.1f} ms; gaps > {min_gap_us:g} us by (stage, op launching the next kernel):"]
    for (stage, op), (total, count) in sorted(blame.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {total / 1e3:8.2f} ms  {count:5d} gaps  {stage:<14} {op}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--min-gap-us", type=float, default=20.0)
    args = p.parse_args()
    print(summarize(load(args.trace), args.min_gap_us), end="")


if __name__ == "__main__":
    main()

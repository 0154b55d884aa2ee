"""bench.trace_gaps: idle device time is blamed on the host range that launched the kernel after the gap."""

from bench import trace_gaps


def _ev(cat, name, ts, dur, corr=None):
    e = {"cat": cat, "name": name, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_gaps_blamed_on_launching_stage_and_op():
    events = [
        _ev("user_annotation", "prepare", 0, 100),
        _ev("user_annotation", "forward", 100, 400),
        _ev("cpu_op", "aten::mm", 110, 10),
        _ev("cuda_runtime", "cudaLaunchKernel", 112, 2, corr=1),
        _ev("cpu_op", "aten::tolist", 300, 150),
        _ev("cuda_runtime", "cudaLaunchKernel", 440, 2, corr=2),
        _ev("kernel", "gemm", 120, 50, corr=1),      # busy 120-170
        _ev("kernel", "add", 450, 30, corr=2),       # 280 us gap before it, launched inside aten::tolist
        _ev("kernel", "mul", 470, 20, corr=99),      # overlaps the previous one: no gap, busy to 490
    ]
    text = trace_gaps.summarize(events, min_gap_us=20)
    assert "host start -> first kernel 0.1 ms" in text
    assert "busy 0.1 ms" in text and "idle 0.3 ms" in text  # span 120-490 = 370 us, busy 50 + 40
    line = next(l for l in text.splitlines() if "aten::tolist" in l)
    assert line.split()[0] == "0.28" and "forward" in line and " 1 gaps" in line


def test_no_device_events():
    assert "no device events" in trace_gaps.summarize([_ev("cpu_op", "x", 0, 1)])

"""The in-process hub `python -m asyncrl.eval` and bench.agentic run the generator's loop against."""

from __future__ import annotations

from asyncrl import records as R
from asyncrl.generator.local_hub import LocalHub


def prompt(i: int, n: int) -> R.Prompt:
    return R.Prompt(prompt_id=f"p{i}", n=n, text="1+1=", sampling=R.SamplingParams())


def test_leases_once_and_counts_what_is_left():
    hub = LocalHub([prompt(0, 2), prompt(1, 3), prompt(2, 1)])
    assert hub.left() == 6
    lease = hub.request(R.LeaseRequest(generator="g", max_prompts=2, wait_s=0.0))
    assert [p.prompt_id for p in lease.prompts] == ["p0", "p1"]
    assert [p.prompt_id for p in hub.request(R.LeaseRequest(generator="g", max_prompts=5)).prompts] == ["p2"]
    assert hub.request(R.LeaseRequest(generator="g", max_prompts=5)).prompts == []
    hub.request(R.ReturnPrompts(lease_id="local", prompt_ids=["p1"], reason="prompt too long for the KV cache"))
    assert hub.failed == {"p1": "prompt too long for the KV cache"} and hub.left() == 3  # given up on: not waited for
    hub.request(R.ReturnPrompts(lease_id="local", prompt_ids=["p2"]))  # handed back unfinished: leased again
    assert [p.prompt_id for p in hub.request(R.LeaseRequest(generator="g", max_prompts=5)).prompts] == ["p2"]
    assert hub.request(R.Heartbeat(service="generator", name="g", stats={})).info == {"policy_version": 0}

"""The decode step in flight (overlapped decode): its rows, its weight version, and where its results land.

With overlap on, `StepLoop.round` (one `TorchEngine.step`) launches decode step k+1 before it reads step k's results, so the GPU
never waits for the host's bookkeeping between two decode steps:

    host   │ plan k+1 · stage k+1 · launch k+1 │ wait(k) │ append k's tokens, finish, free │ plan k+2 · …
    stream │ … step k ─────────────────────── D2H(k) │ H2D(k+1) · step k+1 (unpack first) ──── D2H(k+1) │ …

* Launch (`ResultBuffers.launch`, after the runner queued the step): a non-blocking D2H copy of the step's
  samples (`DecodeBuffers.sampled`, [2, max_batch] float64: tokens, logprobs in rows [:n]) into a pinned host
  buffer, then a CUDA event. Nothing waits.
* Step k+1's input ids never visit the host: its first kernel (`DecodeBuffers.unpack`, inside the graph) takes
  them from step k's samples, still in `sampled`, before step k+1's sampler overwrites it. Its positions,
  sampling steps and KV slots are one past the host's (`stage(..., src)`). Between two replays the stream
  runs the D2H copy of one step's samples and the H2D copy of the next step's inputs, nothing else.
* The one wait: `InflightStep.results()` synchronises on step k's event, after step k+1 is already queued.
* Double buffers: the pinned results (here) and the pinned staging (`DecodeBuffers`) alternate between two
  buffers, because while the host reads step k's results (or writes step k+1's inputs) step k+1's D2H copy
  (or step k's H2D copy) may still be pending on the stream. At most one step is in flight unwaited, so
  the other buffer's last copy is complete.
* Device side: `sampled` is one buffer that every decode step writes; its readers, the D2H copy and the next
  step's unpack, are queued before the next step's sampler, so it is only valid until the next launch.

A prefill (`StepLoop._prefill_then_decode`): after the drain and admission, the prefill is queued, its
samples written where a decode step's land (`sampled`) and their D2H copy queued, then the next decode step, whose
new rows unpack their first tokens from those samples; only then does the host wait for the prefill's copy, while
the GPU decodes:

    host   │ drain k · admit · stage prefill · launch │ stage k+1 · launch k+1 │ wait(prefill) · append │ …
    stream │ … k ─ D2H(k) │ prefill ─ D2H(prefill) │ H2D(k+1) · k+1 ─────────────────── D2H(k+1) │ …

The prefill's copy takes the other pinned buffer (step k's was read by the drain), step k+1 then the one step k
used. The drain before admission stays synchronous: admission and preemption decide on the complete host state,
and queuing the prefill before step k is read would decide differently from the synchronous loop.

One thread both launches and reads (the one driving `step()`), one call apart: a sample's output comes back
one call after the step that sampled its last token; nothing else shares this state.

On CPU the same code runs synchronously (no events, no pinned memory): it is how the tests check that the
overlapped loop gives the same tokens as the synchronous one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.engine.torch.sequence import Sequence


@dataclass(slots=True)
class InflightStep:
    seqs: list[Sequence]  # row i -> its sequence; a row whose sequence stopped meanwhile is discarded
    version: int  # weight version when the step was launched: stamps its tokens
    sampled: torch.Tensor  # [2, >= n] float64 on the device; valid until the next step is launched
    host: torch.Tensor  # the same shape, pinned: receives `sampled`
    done: torch.cuda.Event | None  # recorded after the D2H copy; None on CPU (already done)

    def results(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for the step (the decode loop's one sync) -> (tokens [n] int64, logprobs [n] fp32) on the host,
        converted as the synchronous path converts them."""
        if self.done is not None:
            self.done.synchronize()
        n = len(self.seqs)
        return self.host[0, :n].long(), self.host[1, :n].float()


class ResultBuffers:
    """Two pinned [2, max_batch] float64 buffers and their events, used in turn by consecutive launches."""

    def __init__(self, max_batch: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.flat = [torch.empty(2 * max_batch, dtype=torch.float64, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self.device, self.turn = device, 0

    def launch(self, seqs: list[Sequence], sampled: torch.Tensor, version: int) -> InflightStep:
        """Queue the copy of a just-queued step's samples ([2, >= len(seqs)], contiguous) to the host; -> its
        record."""
        i, self.turn = self.turn, self.turn ^ 1
        host = self.flat[i][: sampled.numel()].view(sampled.shape)  # whole rows: a contiguous copy
        host.copy_(sampled, non_blocking=True)
        event = self.events[i]
        if event is not None:
            event.record(torch.cuda.current_stream(self.device))  # the stream the copy was queued on
        return InflightStep(seqs, version, sampled, host, event)

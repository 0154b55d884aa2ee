"""The double's radix cache: the KV SGLang's prefix cache would serve a request, with the weights version that
computed each cached token, so that serving KV of other weights shows.

SGLang matches a request's ids against the KV of earlier requests (finished, aborted or retracted ones) under
the same `extra_key` (its cache namespace) and recomputes only the rest; at least the last id is recomputed.
Nothing in the real server checks which weights computed the matched KV: after a weight update without a flush
(in_place pauses cannot flush) it serves the old weights' KV. The double serves it too and makes it visible:
a request whose matched KV holds a token of another version is *stale*, counted in `SGLangDouble.stale_kv_served`,
and it samples from poisoned logits, so its logprobs match no version's and a test comparing them fails.
"""

from __future__ import annotations


class RadixCache:
    def __init__(self) -> None:
        self.entries: dict[tuple[str | None, tuple[int, ...]], list[str]] = {}  # (extra_key, ids) -> KV version per id

    def __len__(self) -> int:
        return len(self.entries)

    def match(self, extra_key: str | None, ids: list[int]) -> list[str]:
        """Versions of the KV of the longest cached prefix of `ids` (at most all but the last id) in the namespace."""
        best: list[str] = []
        for (key, cached), versions in self.entries.items():
            if key != extra_key:
                continue
            n = 0
            limit = min(len(cached), len(versions), len(ids) - 1)
            while n < limit and cached[n] == ids[n]:
                n += 1
            if n > len(best):
                best = versions[:n]
        return list(best)

    def insert(self, extra_key: str | None, ids: list[int], versions: list[str]) -> None:
        """Keep the KV of `ids` (one version per id) for later requests of the namespace."""
        if ids:
            self.entries[(extra_key, tuple(ids))] = list(versions)

    def clear(self) -> None:
        self.entries.clear()

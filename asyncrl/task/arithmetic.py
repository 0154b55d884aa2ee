"""The embedded synthetic task: multi-digit integer arithmetic with a checkable answer.

A problem reads "37+48=" and its answer is "85" (subtraction may give "-11"). The generator is seeded
and endless; the verifier scores a completion 1.0 when the text before the first EOS is the answer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

# Special-token spellings of the embedded tokenizer (asyncrl.task.tokenizer); a response decoded
# without skip_special_tokens may still carry them.
EOS = "<eos>"
_SPECIALS = ("<pad>", "<bos>")


@dataclass(frozen=True, slots=True)
class Problem:
    text: str  # "37+48="
    answer: str  # "85"


def make_problem(rng: random.Random, digits: int, ops: str) -> Problem:
    """Operands have 1..`digits` digits (the length is drawn uniformly, then the value)."""
    a, b = (_operand(rng, digits) for _ in range(2))
    op = rng.choice(ops)
    answer = a + b if op == "+" else a - b
    return Problem(text=f"{a}{op}{b}=", answer=str(answer))


def _operand(rng: random.Random, digits: int) -> int:
    n = rng.randint(1, digits)
    return rng.randint(0 if n == 1 else 10 ** (n - 1), 10**n - 1)


def problems(seed: int, digits: int, ops: str) -> Iterator[Problem]:
    rng = random.Random(seed)
    while True:
        yield make_problem(rng, digits, ops)


def extract_answer(response: str) -> str:
    """The text before the first EOS, without special tokens and surrounding whitespace."""
    text = response.split(EOS, 1)[0]
    for special in _SPECIALS:
        text = text.replace(special, "")
    return text.strip()


def verify(response: str, target: str) -> float:
    """1.0 when the completion's answer is exactly `target` (as written: no leading zeros or '+')."""
    return 1.0 if extract_answer(response) == target.strip() else 0.0


_PROBLEM = re.compile(r"\s*(\d+)\s*([+-])\s*(\d+)\s*=\s*")


def solve(text: str) -> str | None:
    """The answer of a problem written as the task writes them ("12+34=" -> "46"); None for other text."""
    m = _PROBLEM.fullmatch(text)
    if m is None:
        return None
    a, op, b = int(m[1]), m[2], int(m[3])
    return str(a + b if op == "+" else a - b)

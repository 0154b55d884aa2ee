"""A JSONL prompt file of arithmetic questions behind a long worked-examples preamble, for pipeline runs where
training should weigh about as much as generation: the learner trains on prompt + response tokens, while a
generator's cost is mostly the response's decode steps (a prompt is one cheap prefill). With the embedded
tokenizer, `--examples 19` gives prompts of ~180 tokens.

    python -m bench.long_prompts --out /tmp/long.jsonl
    python -m bench.pipeline configs/gpu-2.toml --set task.name=jsonl --set task.path=/tmp/long.jsonl ...
"""

from __future__ import annotations

import argparse
import json
import random


def rows(count: int, examples: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        shown = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(examples)]
        preamble = "".join(f"{a}+{b}={a + b}; " for a, b in shown)
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"text": f"{preamble}{a}+{b}=", "target": str(a + b)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=4096)
    p.add_argument("--examples", type=int, default=19, help="worked examples before each question")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with open(args.out, "w") as f:
        for row in rows(args.count, args.examples, args.seed):
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

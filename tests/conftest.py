"""One intra-op thread per test process, unless the caller set OMP_NUM_THREADS.

The suite runs one pytest worker per core (`-n 2` on the 2-core VM), and most of its CPU goes to processes the
end-to-end tests launch (generator, learner, reward, hub), which inherit this environment. With torch's default of
one thread per core in each of them, the cores are oversubscribed and OpenMP's spin-waiting burns the difference:
on the 2-core VM (2026-12-06) tests/learner took 196 CPU-s with the default and 163 with one thread, tests/e2e 355
and 275 (wall 107 -> 95 s and 219 -> 179 s). Set here, before any test module imports torch, so it reaches both the
workers and everything they start. Tests that depend on a thread count set their own (asyncrl.task.embedded).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

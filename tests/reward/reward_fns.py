"""Reward functions for the python-kind tests (imported by dotted path, also inside pool processes)."""

import asyncio
import os
import time


def length(response, spec):
    return len(response) / 10


async def async_half(response, spec):
    await asyncio.sleep(0)
    return 0.5


def with_details(response, spec):
    return {"reward": 0.25, "chars": len(response)}


def dict_without_reward(response, spec):
    return {"score": 1.0}


def target_len(response, spec):
    return float(len(spec.target))


def pid(response, spec):
    return float(os.getpid())


def raises(response, spec):
    raise ValueError("boom")


def hangs(response, spec):
    time.sleep(60)
    return 1.0


async def async_hangs(response, spec):
    await asyncio.sleep(60)
    return 1.0


def returns_nan(response, spec):
    return float("nan")


def returns_text(response, spec):
    return "1.0"


def dies(response, spec):
    os._exit(3)


def slow(response, spec):
    time.sleep(0.3)
    return 1.0


def sleep_then_one(seconds):
    time.sleep(seconds)
    return 1.0


def sleep_forever():
    time.sleep(600)

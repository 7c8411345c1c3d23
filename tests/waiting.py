"""Waiting for real parts to get somewhere: poll until a condition holds.

The deadline only turns a hang into a clear failure; nothing is timed or asserted about speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(fn: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str, limit_s: float = 90) -> T:
    """Await ``fn`` until ``ok`` holds for its value; return that value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        value = await fn()
        if ok(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what} (last: {value!r})")
        await asyncio.sleep(0.5)

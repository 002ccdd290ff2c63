"""Query parameters: parsed and validated, or `errors.InvalidArgumentError` naming them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tensorboard import errors

__all__ = ["string", "integer", "choice", "step", "number"]


def _raw(request, name: str) -> str | None:
    v = request.args.get(name)
    return None if v is None else str(v)


def string(request, name: str, *, required: bool = False, default: str | None = None):
    """A string parameter; required ones must be present (the empty string is a value)."""
    v = _raw(request, name)
    if v is None:
        if required:
            raise errors.InvalidArgumentError(f"missing required parameter `{name}`")
        return default
    if "\x00" in v:
        raise errors.InvalidArgumentError(f"parameter `{name}` must not contain NUL bytes")
    return v


def integer(request, name: str, *, default: int | None, lo: int, hi: int) -> int | None:
    """An integer parameter in ``[lo, hi]``."""
    v = _raw(request, name)
    if v is None or v == "":
        return default
    try:
        x = int(v.strip(), 10)
    except ValueError:
        raise errors.InvalidArgumentError(
            f"parameter `{name}` must be an integer, got {v[:40]!r}"
        ) from None
    if not lo <= x <= hi:
        raise errors.InvalidArgumentError(
            f"parameter `{name}` must be between {lo} and {hi}, got {x}"
        )
    return x


def number(request, name: str, *, default: float | None, lo: float, hi: float, hi_open=False):
    """A finite float parameter in ``[lo, hi]`` (``[lo, hi)`` with ``hi_open``)."""
    v = _raw(request, name)
    if v is None or v == "":
        return default
    try:
        x = float(v)
    except ValueError:
        x = math.nan
    ok = math.isfinite(x) and lo <= x and (x < hi if hi_open else x <= hi)
    if not ok:
        bracket = ")" if hi_open else "]"
        raise errors.InvalidArgumentError(
            f"parameter `{name}` must be a number in [{lo}, {hi}{bracket}, got {v[:40]!r}"
        )
    return x


def choice(request, name: str, options: Sequence[str], *, default: str | None) -> str:
    """One of ``options``; missing gives ``default`` (required when default is None)."""
    v = _raw(request, name)
    if v is None or v == "":
        if default is None:
            raise errors.InvalidArgumentError(
                f"missing required parameter `{name}` (one of: {', '.join(options)})"
            )
        return default
    if v not in options:
        raise errors.InvalidArgumentError(
            f"parameter `{name}` must be one of: {', '.join(options)}; got {v[:40]!r}"
        )
    return v


_MAX_STEP = 2**63 - 1


def step(request, *, allow_all: bool = False) -> int | str | None:
    """``step``: None when omitted (the latest step), an int64, or "all" if allowed."""
    v = _raw(request, "step")
    if v is None or v == "" or v == "latest":
        return None
    if allow_all and v == "all":
        return "all"
    try:
        x = int(v.strip(), 10)
    except ValueError:
        expected = "an integer, 'latest' or 'all'" if allow_all else "an integer or 'latest'"
        raise errors.InvalidArgumentError(
            f"parameter `step` must be {expected}, got {v[:40]!r}"
        ) from None
    if not -_MAX_STEP - 1 <= x <= _MAX_STEP:
        raise errors.InvalidArgumentError(f"parameter `step` must be a 64-bit integer, got {x}")
    return x

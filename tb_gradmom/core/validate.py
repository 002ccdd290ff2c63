"""Arguments checked at the call, with messages that name the argument, the value and the fix.

Python numbers are checked by type (``2.7`` is not an order, ``True`` is not a count); tensors by
dtype and rank at trace time (their values are only known when the step runs).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = [
    "positive_int",
    "optional_positive_int",
    "int_tensor_or_int",
    "float_scalar",
    "positive_float",
    "boolean",
    "INT64_MAX",
]

INT64_MAX = (1 << 63) - 1


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral | np.integer) and not isinstance(
        value, bool | np.bool_
    )


def positive_int(name: str, value: Any, fix: str = "") -> int:
    """``value`` as a Python int >= 1, or `ValueError`/`TypeError` naming ``name``."""
    if not _is_int(value):
        raise TypeError(
            f"{name} must be a positive integer, got {value!r} ({type(value).__name__})"
            + (f"; {fix}" if fix else "")
        )
    if int(value) < 1:
        raise ValueError(
            f"{name} must be a positive integer, got {value!r}" + (f"; {fix}" if fix else "")
        )
    if int(value) > INT64_MAX:
        raise ValueError(
            f"{name} must fit in a signed 64-bit integer (at most {INT64_MAX}), got {value!r}"
            + (f"; {fix}" if fix else "")
        )
    return int(value)


def boolean(name: str, value: Any) -> bool:
    """``value`` as a bool: True or False only (``"yes"`` and ``1`` are refused)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def positive_float(name: str, value: Any) -> numbers.Real | np.number | tf.Tensor | None:
    """`float_scalar`, and a Python number must be finite and positive (a learning rate)."""
    value = float_scalar(name, value)
    if isinstance(value, numbers.Real | np.number) and not (
        np.isfinite(float(value)) and float(value) > 0
    ):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return value


def optional_positive_int(name: str, value: Any, fix: str = "") -> int | None:
    return None if value is None else positive_int(name, value, fix)


def int_tensor_or_int(
    name: str, value: Any, *, positive: bool = False, scalar: bool = True
) -> int | tf.Tensor | tf.Variable | None:
    """A Python int (checked) or an integer tensor (dtype and rank checked at trace time)."""
    if value is None:
        return None
    if isinstance(value, tf.Tensor | tf.Variable):
        if not value.dtype.is_integer:
            raise TypeError(
                f"{name} must be an integer tensor, got dtype {value.dtype.name}; "
                f"pass tf.cast({name}, tf.int64)"
            )
        if scalar and value.shape.rank not in (None, 0):
            raise ValueError(f"{name} must be a scalar, got shape {value.shape}")
        return value
    if not _is_int(value):
        raise TypeError(
            f"{name} must be an integer (or an integer tensor), got {value!r} "
            f"({type(value).__name__})"
        )
    if positive and int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not -INT64_MAX - 1 <= int(value) <= INT64_MAX:
        raise ValueError(
            f"{name} must fit in a signed 64-bit integer (TensorBoard's steps are int64), "
            f"got {value!r}"
        )
    return int(value)


def float_scalar(name: str, value: Any) -> numbers.Real | np.number | tf.Tensor | None:
    """A real number or a floating-point scalar tensor (a learning rate, a loss scale)."""
    if value is None:
        return None
    if isinstance(value, tf.Tensor | tf.Variable):
        if not (value.dtype.is_floating or value.dtype.is_integer):
            raise TypeError(f"{name} must be a number, got a {value.dtype.name} tensor")
        if value.shape.rank not in (None, 0):
            raise ValueError(f"{name} must be a scalar, got shape {value.shape}")
        return value
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise TypeError(
            f"{name} must be a number or a scalar tensor, got {value!r} ({type(value).__name__})"
        )
    if isinstance(value, numbers.Real | np.number):
        return value
    try:  # a Keras variable (a LossScaleOptimizer's dynamic_scale) or another tensor-like
        t = tf.convert_to_tensor(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a number or a scalar tensor, got {value!r} ({type(value).__name__})"
        ) from None
    return float_scalar(name, t)

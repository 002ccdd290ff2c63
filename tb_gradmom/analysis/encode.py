"""The one encoder of numbers and file names: JSON and CSV with NaN/Inf tokens, .npy, names.

Used by the plugin's responses and exports and by ``tb-gradmom export`` (numpy only, no
TensorFlow). The tab's JavaScript follows the same file-name rule (`tb_gradmom_frontend/core.js`
``fileName``), checked against `file_name` on shared cases by the tests.

JSON has no NaN or Infinity. Everywhere a non-finite number is the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"``: the convention of TensorBoard's own `json_util.Cleanse`,
and what JavaScript's ``Number(x)`` turns back into the number. Float arrays are written with
9 significant digits (exact for float32 data) unless ``digits=None`` asks for every digit;
float scalars exactly. CSV uses the same three tokens, which Python's ``float()``, numpy and
pandas read back.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "NAN",
    "POS_INF",
    "NEG_INF",
    "NAME_MAX",
    "to_json",
    "float_token",
    "csv_table",
    "npy_bytes",
    "file_name",
    "clean_part",
]

NAN = "NaN"
POS_INF = "Infinity"
NEG_INF = "-Infinity"


def float_token(x: float, digits: int | None = 9) -> str:
    """A float as text: ``digits`` significant digits (None: exact), or a non-finite token."""
    if math.isfinite(x):
        if x == int(x) and abs(x) < 1e15:
            return str(int(x))
        return repr(x) if digits is None else format(x, f".{digits}g")
    if math.isnan(x):
        return NAN
    return POS_INF if x > 0 else NEG_INF


_JSON_NONFINITE = {NAN: '"NaN"', POS_INF: '"Infinity"', NEG_INF: '"-Infinity"'}


def _json_float(x: float, digits: int | None = 9) -> str:
    t = float_token(x, digits)
    return _JSON_NONFINITE.get(t, t)


def _json_array(a: np.ndarray, digits: int | None) -> str:
    if a.dtype.kind == "b":
        return json.dumps(a.ravel().tolist())
    if a.dtype.kind in "iu":
        return json.dumps(a.ravel().astype(np.int64).tolist())
    flat = np.asarray(a, dtype=np.float64).ravel()
    values = flat.tolist()
    if digits is not None and np.isfinite(flat).all():
        return "[" + ",".join([format(v, f".{digits}g") for v in values]) + "]"
    return "[" + ",".join([_json_float(v, digits) for v in values]) + "]"


def to_json(obj, digits: int | None = 9, nested: bool = False) -> str:
    """Serialises dicts, lists, numpy arrays and scalars to JSON text.

    Non-finite floats become ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (see module docstring).
    Float scalars and Python lists of floats (wall times) are written exactly; numpy float
    arrays (statistics) with ``digits`` significant digits (None: exactly). Arrays are flat
    (row-major; the plugin's payloads give their shape beside them), or nested lists of their
    shape with ``nested=True`` (the export's files).
    """
    parts: list[str] = []
    _emit(obj, parts, digits, nested)
    return "".join(parts)


def _emit(obj, out: list[str], digits: int | None, nested: bool = False) -> None:
    if obj is None or isinstance(obj, (bool, np.bool_)):
        out.append(json.dumps(None if obj is None else bool(obj)))
    elif isinstance(obj, (int, np.integer)):
        out.append(str(int(obj)))
    elif isinstance(obj, (float, np.floating)):
        out.append(_json_float(float(obj), None))
    elif isinstance(obj, str):
        out.append(json.dumps(obj))
    elif isinstance(obj, np.ndarray):
        if nested and obj.ndim > 1:
            _emit(list(obj), out, digits, nested)
        else:
            out.append(_json_array(obj, digits))
    elif isinstance(obj, Mapping):
        out.append("{")
        for i, (k, v) in enumerate(obj.items()):
            if i:
                out.append(",")
            out.append(json.dumps(str(k)))
            out.append(":")
            _emit(v, out, digits, nested)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _emit(v, out, digits, nested)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def _cell(v, digits: int | None) -> str:
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return float_token(float(v), digits)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return str(v)


def csv_table(header: Sequence[str], rows: Iterable[Sequence], digits: int | None = 9) -> str:
    """CSV text (RFC 4180, ``\\r\\n`` line ends) with floats as in `float_token` (``digits``
    significant digits, None: exactly), booleans as 0/1 and None as an empty field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(header)
    for row in rows:
        w.writerow([_cell(v, digits) for v in row])
    return buf.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    """The bytes of a ``.npy`` file holding ``array`` (no pickled objects)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()


# ----------------------------------------------------------------------------- file names

NAME_MAX = 255  # bytes in a file name (Linux, macOS, Windows)
_HASH_CHARS = 8


def clean_part(part: Any) -> str:
    """One part of a file name: runs of characters outside ``[A-Za-z0-9._-]`` become ``_``,
    and leading or trailing ``.``, ``_`` and ``-`` go (so the root run ``"."`` is empty)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(part)).strip("._-")


def _fnv1a(text: str) -> str:
    """FNV-1a (32 bits) of the UTF-8 bytes, as 8 hex digits: a hash the tab can compute too."""
    h = 0x811C9DC5
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def file_name(parts: Sequence[Any], ext: str, max_bytes: int = NAME_MAX) -> str:
    """A file name from parts: each cleaned by `clean_part`, the non-empty ones joined by ``-``.

    Args:
      parts: e.g. ``["train", "dense/kernel", "step10", "variance"]``; None, empty parts and
        the root run ``"."`` drop out.
      ext: the extension without dot.
      max_bytes: the longest name allowed; a longer one keeps its beginning and ends with
        ``-`` and the FNV-1a hash of the whole stem (`_fnv1a`), so different long names stay
        different.

    Returns:
      e.g. ``"train-dense_kernel-step10-variance.png"`` (``"gradmom.<ext>"`` if nothing is left).
    """
    stem = "-".join(c for c in (clean_part(p) for p in parts if p is not None) if c) or "gradmom"
    suffix = "." + ext
    if len(stem) + len(suffix) <= max_bytes:  # cleaned names are ASCII: characters are bytes
        return stem + suffix
    keep = max(1, max_bytes - len(suffix) - 1 - _HASH_CHARS)
    return f"{stem[:keep]}-{_fnv1a(stem)}{suffix}"

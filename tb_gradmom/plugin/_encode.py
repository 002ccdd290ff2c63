"""Response encodings: JSON with NaN/Inf tokens, CSV and .npy (numpy only).

JSON has no NaN or Infinity. Everywhere in this plugin's responses a non-finite number is the
string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``: the convention of TensorBoard's own
`json_util.Cleanse`, and what JavaScript's ``Number(x)`` turns back into the number. Finite
floats are written with 9 significant digits (exact for float32 data). CSV uses the same three
tokens, which Python's ``float()``, numpy and pandas read back.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["NAN", "POS_INF", "NEG_INF", "to_json", "float_token", "csv_table", "npy_bytes"]

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


def _json_array(a: np.ndarray) -> str:
    if a.dtype.kind in "iub":
        return json.dumps(a.ravel().astype(np.int64).tolist())
    flat = np.asarray(a, dtype=np.float64).ravel()
    values = flat.tolist()
    if np.isfinite(flat).all():
        return "[" + ",".join([format(v, ".9g") for v in values]) + "]"
    return "[" + ",".join([_json_float(v) for v in values]) + "]"


def to_json(obj) -> str:
    """Serialises dicts, lists, numpy arrays (flattened, row-major) and scalars to JSON text.

    Non-finite floats become ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (see module docstring).
    Float scalars and Python lists of floats (wall times) are written exactly; numpy float
    arrays (statistics) with 9 significant digits.
    """
    parts: list[str] = []
    _emit(obj, parts)
    return "".join(parts)


def _emit(obj, out: list[str]) -> None:
    if obj is None or isinstance(obj, bool):
        out.append(json.dumps(obj))
    elif isinstance(obj, (int, np.integer)):
        out.append(str(int(obj)))
    elif isinstance(obj, (float, np.floating)):
        out.append(_json_float(float(obj), None))
    elif isinstance(obj, str):
        out.append(json.dumps(obj))
    elif isinstance(obj, np.ndarray):
        out.append(_json_array(obj))
    elif isinstance(obj, Mapping):
        out.append("{")
        for i, (k, v) in enumerate(obj.items()):
            if i:
                out.append(",")
            out.append(json.dumps(str(k)))
            out.append(":")
            _emit(v, out)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _emit(v, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def _cell(v) -> str:
    if isinstance(v, (float, np.floating)):
        return float_token(float(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return str(v)


def csv_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """CSV text (RFC 4180, ``\\r\\n`` line ends) with floats as in `float_token`."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for row in rows:
        w.writerow([_cell(v) for v in row])
    return buf.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    """The bytes of a ``.npy`` file holding ``array`` (no pickled objects)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()

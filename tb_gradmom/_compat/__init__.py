"""The boundary between tb_gradmom and the private APIs of its dependencies.

Every private symbol of a dependency that tb_gradmom uses is reached through one module here,
one module per dependency:

* `tb_gradmom._compat.tf_private`: TensorFlow (``tensorflow.python.*`` and private methods of
  TensorFlow's graph objects).
* `tb_gradmom._compat.keras_private`: Keras (``keras.src.*`` and private attributes of Keras
  models).
* TensorBoard's internals are in `tb_gradmom.plugin._tb_compat`, next to the plugin, which must
  not import TensorFlow.

Each module's docstring lists its symbols: why each is needed and what breaks without it.
Importing this package (or ``tb_gradmom``) never touches a private symbol: a symbol is looked up
when it is first used, and a missing one raises `PrivateAPIError` at that point, naming the
symbol, the installed version and the feature that is unavailable. ``tests/test_compat.py``
checks every symbol against the installed TensorFlow, Keras and TensorBoard, and that no module
of tb_gradmom outside these files reaches a private API.

This package imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PrivateAPIError", "installed_version", "resolve"]


def installed_version(package: str) -> str:
    """The ``__version__`` of an importable ``package``, or ``"(unknown version)"``."""
    try:
        return str(importlib.import_module(package).__version__)
    except Exception:  # noqa: BLE001 - only for an error message
        return "(unknown version)"


class PrivateAPIError(RuntimeError):
    """A private symbol of TensorFlow or Keras that a tb_gradmom feature needs is missing.

    Attributes: ``symbol`` (its dotted path), ``package``, ``version`` (installed) and
    ``feature`` (what is unavailable).
    """

    # Let the error leave a tf.function unchanged (AutoGraph would re-wrap it otherwise).
    ag_pass_through = True

    def __init__(self, symbol: str, package: str, feature: str, cause: BaseException | None = None):
        self.symbol = symbol
        self.package = package
        self.version = installed_version(package)
        self.feature = feature
        why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        super().__init__(
            f"tb_gradmom: {feature} is unavailable with {package} {self.version}: it needs the "
            f"private {package} API `{symbol}`, which this version does not have{why}. "
            f"Install a {package} version that tb_gradmom supports, or report this version "
            "to tb_gradmom."
        )


def resolve(package: str, module: str, attribute: str, feature: str) -> Any:
    """``module.attribute`` (``attribute`` may be dotted, e.g. ``Graph._get_function``).

    Raises:
      PrivateAPIError: the module cannot be imported or has no such attribute.
    """
    try:
        obj: Any = importlib.import_module(module)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise PrivateAPIError(f"{module}.{attribute}", package, feature, e) from e
    return obj

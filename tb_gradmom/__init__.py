"""Grad Moments: exact moments of per-example gradients for TensorFlow 2, and a TensorBoard tab.

    import tb_gradmom as gradmom
    grads, moments = gradmom.gradients_and_moments(loss, var_list, orders=(1, 2))

The package imports lazily: ``import tb_gradmom`` does not import TensorFlow, so the
TensorBoard plugin (which lives here too) stays cheap to load. TensorFlow is imported on first
use of an attribute that needs it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

__version__ = "0.1.0"  # the one place: setup.py reads this line (a regex, no import)

__all__ = [
    "gradients_and_moments",
    "per_example_norms",
    "plan_moments",
    "variance",
    "UnsupportedOpError",
    "BatchSizeError",
    "PerExampleLossError",
    "GradientTape",
    "summary",
    "keras",
    "data",
    "stats",
    "metadata",
    "plot",
]

# Public name -> (module, attribute or None for the module itself).
_LAZY = {
    "gradients_and_moments": ("tb_gradmom.core.moments", "gradients_and_moments"),
    "variance": ("tb_gradmom.core.moments", "variance"),
    "per_example_norms": ("tb_gradmom.core.norms", "per_example_norms"),
    "plan_moments": ("tb_gradmom.core.plan", "plan_moments"),
    "UnsupportedOpError": ("tb_gradmom.core.errors", "UnsupportedOpError"),
    "BatchSizeError": ("tb_gradmom.core.errors", "BatchSizeError"),
    "PerExampleLossError": ("tb_gradmom.core.errors", "PerExampleLossError"),
    "GradientTape": ("tb_gradmom.writers.tape", "GradientTape"),
    "summary": ("tb_gradmom.writers.summary", None),
    "keras": ("tb_gradmom.writers.keras", None),
    "data": ("tb_gradmom.analysis.data", None),
    "stats": ("tb_gradmom.analysis.stats", None),
    "metadata": ("tb_gradmom.metadata", None),
    "plot": ("tb_gradmom.viz.plot", None),
}


# Documented submodule names that live elsewhere: `import tb_gradmom.keras` and
# `from tb_gradmom.data import load` give the module behind the public name.
_ALIASES = {f"{__name__}.{name}": module for name, (module, attr) in _LAZY.items() if attr is None}


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = importlib.import_module(_ALIASES[spec.name])
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # the target module ran when it was imported; the import system has just set its
        # __spec__ to the alias's: give it back its own
        module.__spec__ = self.spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the public aliases (``tb_gradmom.keras`` -> ``tb_gradmom.writers.keras``): the
    import system then binds the real module under both names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _ALIASES or fullname == _ALIASES[fullname]:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader())


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tb_gradmom' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

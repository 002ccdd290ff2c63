"""TensorBoard's entry point for the Grad Moments tab (``tensorboard_plugins: gradmom``).

A plugin loader runs inside every ``tensorboard`` start-up once the package is installed, for
every user, whatever dashboard they came for: nothing here may raise. The plugin itself is
imported lazily in `GradMomentsPluginLoader.load`, and any failure there is logged and turns
into "no Grad Moments tab" rather than a TensorBoard crash. Nothing here imports TensorFlow.

Sampling: TensorBoard keeps only a sample of the steps of each tensor time series, per plugin:
10 steps (Python loader) or 100 (RustBoard) for a plugin it does not know. `fix_flags` sets
``--samples_per_plugin`` for ``gradmom`` and ``gradmom_examples`` (the per-example norms) to
`DEFAULT_SAMPLES` unless the user gave a value, so both loaders keep `DEFAULT_SAMPLES` steps per
tag (``gradmom=0`` keeps all).
"""

from __future__ import annotations

import argparse
import logging
import os

from tensorboard.plugins import base_plugin

logger = logging.getLogger(__name__)

__all__ = [
    "GradMomentsPluginLoader",
    "DEFAULT_SAMPLES",
    "PLUGIN_NAME",
    "DEFAULT_CACHE_MB",
    "cache_mb",
    "max_cache_mb",
    "FlagError",
]

PLUGIN_NAME = "gradmom"  # = tb_gradmom.metadata.PLUGIN_NAME, not imported to stay minimal
EXAMPLES_PLUGIN_NAME = "gradmom_examples"  # = metadata.EXAMPLES_PLUGIN_NAME
# Steps kept per Grad Moments tag unless --samples_per_plugin says otherwise (as histograms).
DEFAULT_SAMPLES = 500
# --gradmom_cache_mb when not given.
DEFAULT_CACHE_MB = 512
# The largest --gradmom_cache_mb where the machine's memory cannot be read (1 TiB).
_FALLBACK_MAX_CACHE_MB = 1 << 20


class FlagError(argparse.ArgumentTypeError, ValueError):
    """A flag's value out of its bounds: TensorBoard's parser shows the message and stops."""


def max_cache_mb() -> int:
    """The largest ``--gradmom_cache_mb``: this machine's physical memory in MiB (a cache
    bigger than the memory could never be filled without swapping)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return _FALLBACK_MAX_CACHE_MB
    return max(1, total >> 20) if total > 0 else _FALLBACK_MAX_CACHE_MB


def cache_mb(value) -> int:
    """``--gradmom_cache_mb`` checked: an integer number of MiB from 1 to `max_cache_mb`.

    Raises:
      FlagError (an `argparse.ArgumentTypeError` and a ValueError): naming the flag, the value
        and the fix.
    """
    hi = max_cache_mb()
    fix = f"pass an integer from 1 to {hi} (MiB), or leave it out for {DEFAULT_CACHE_MB}"
    if isinstance(value, bool):
        value = repr(value)
    try:
        mb = int(value) if isinstance(value, int) else int(str(value).strip())
    except ValueError:
        raise FlagError(
            f"--gradmom_cache_mb must be an integer number of MiB, got {value!r}; {fix}"
        ) from None
    if not 1 <= mb <= hi:
        why = "at least 1" if mb < 1 else f"at most this machine's memory, {hi} MiB"
        raise FlagError(
            f"--gradmom_cache_mb={mb} is out of range: the cache's budget must be {why}; {fix}"
        )
    return mb


class GradMomentsPluginLoader(base_plugin.TBLoader):
    """Loads `tb_gradmom.plugin.GradMomentsPlugin`; never raises."""

    def define_flags(self, parser):
        try:
            group = parser.add_argument_group("gradmom")
            group.add_argument(
                "--gradmom_cache_mb",
                type=cache_mb,
                default=None,
                metavar="MiB",
                help="Memory budget in MiB of the Grad Moments tab's cache of decoded "
                f"moments and computed responses, from 1 to this machine's memory "
                f"({max_cache_mb()}; default: {DEFAULT_CACHE_MB}); the tab's memory stays "
                "within it plus 448 MiB of requests in flight (see docs/http_api.md).",
            )
        except Exception:  # noqa: BLE001 - e.g. a flag defined twice; TensorBoard must start
            logger.warning("Grad Moments: could not define its flags", exc_info=True)

    def fix_flags(self, flags):
        try:
            current = getattr(flags, "samples_per_plugin", None)
            if current is None or current == "":
                current = {}
            if isinstance(current, dict):
                updated = dict(current)
                for name in (PLUGIN_NAME, EXAMPLES_PLUGIN_NAME):
                    updated.setdefault(name, DEFAULT_SAMPLES)
                if updated != current:
                    flags.samples_per_plugin = updated
        except Exception:  # noqa: BLE001
            logger.warning("Grad Moments: could not set its samples_per_plugin", exc_info=True)

    def load(self, context):
        try:
            from tb_gradmom.plugin.plugin import GradMomentsPlugin

            return GradMomentsPlugin(context)
        except Exception:  # noqa: BLE001 - a broken install must not crash TensorBoard
            logger.error("Grad Moments: the plugin could not be loaded", exc_info=True)
            return None

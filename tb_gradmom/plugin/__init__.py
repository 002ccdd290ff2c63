"""The Grad Moments TensorBoard plugin (backend). Imports no TensorFlow.

TensorBoard finds it through the ``tensorboard_plugins`` entry point
(`tb_gradmom.plugin.loader.GradMomentsPluginLoader`), which must stay cheap and never raise:
this package therefore imports nothing at start-up, and `GradMomentsPlugin` is loaded on first
use. The routes are documented in docs/http_api.md.
"""

from __future__ import annotations

import importlib

__all__ = ["GradMomentsPlugin"]


def __getattr__(name: str):
    if name == "GradMomentsPlugin":
        return importlib.import_module("tb_gradmom.plugin.plugin").GradMomentsPlugin
    raise AttributeError(f"module 'tb_gradmom.plugin' has no attribute {name!r}")

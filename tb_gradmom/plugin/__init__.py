"""The Grad Moments TensorBoard plugin (backend). Imports no TensorFlow.

TensorBoard finds it through the ``tensorboard_plugins`` entry point
(`tb_gradmom.plugin_loader.GradMomentsPluginLoader`); the routes are documented in
docs/http_api.md.
"""

from tb_gradmom.plugin.plugin import GradMomentsPlugin

__all__ = ["GradMomentsPlugin"]

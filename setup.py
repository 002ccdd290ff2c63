"""Packaging for Grad Moments (tb_gradmom)."""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).resolve().parent


def read_version() -> str:
    """``__version__`` of tb_gradmom/__init__.py, read without importing the package."""
    text = (HERE / "tb_gradmom" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", text, re.MULTILINE)
    if match is None:
        raise RuntimeError("tb_gradmom/__init__.py has no __version__ = '...' line")
    return match.group(1)


setup(
    name="tb_gradmom",
    version=read_version(),
    description=(
        "Exact per-example gradient moments for TensorFlow 2 and a TensorBoard "
        "plugin to look at them."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tb_gradmom", "tb_gradmom.*", "tb_gradmom_frontend"]),
    package_data={
        "tb_gradmom_frontend": ["*.js", "*.css", "*.html", "**/*"],
        "tb_gradmom.analysis": ["statistics.json"],
    },
    include_package_data=True,
    install_requires=[
        "tensorflow>=2.16",
        "tensorboard>=2.16",
        "protobuf",
        "numpy",
    ],
    extras_require={
        "plots": ["matplotlib"],
        "test": [
            "pytest",
            "ruff",
            "mypy>=2.4,<3",
            "playwright",
            "matplotlib",
            "keras-hub==0.32.0",
        ],
    },
    entry_points={
        "console_scripts": ["tb-gradmom = tb_gradmom.cli:main"],
        "tensorboard_plugins": ["gradmom = tb_gradmom.plugin.loader:GradMomentsPluginLoader"],
    },
)

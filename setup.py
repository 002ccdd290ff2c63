"""Packaging for Grad Moments (tb_gradmom)."""

from setuptools import find_packages, setup

setup(
    name="tb_gradmom",
    version="0.1.0",
    description=(
        "Exact per-example gradient moments for TensorFlow 2 and a TensorBoard "
        "plugin to look at them."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tb_gradmom", "tb_gradmom.*", "tb_gradmom_frontend"]),
    package_data={"tb_gradmom_frontend": ["*.js", "*.css", "*.html", "**/*"]},
    include_package_data=True,
    install_requires=[
        "tensorflow>=2.16",
        "tensorboard>=2.16",
        "protobuf",
        "numpy",
    ],
    extras_require={
        "plots": ["matplotlib"],
        "test": ["pytest", "ruff", "playwright", "matplotlib", "keras-hub==0.32.0"],
    },
    entry_points={
        "console_scripts": ["tb-gradmom = tb_gradmom.cli:main"],
        "tensorboard_plugins": ["gradmom = tb_gradmom.plugin_loader:GradMomentsPluginLoader"],
    },
)

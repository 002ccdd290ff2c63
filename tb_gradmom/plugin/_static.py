"""Static files of the frontend (`tb_gradmom_frontend`), resolved without path escapes."""

from __future__ import annotations

import importlib.util
import os

__all__ = ["MIME_TYPES", "frontend_dir", "resolve"]

# The only file types served, with their MIME types (ES modules need a JavaScript MIME type).
MIME_TYPES: dict[str, str] = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".map": "application/json",
    ".html": "text/html",
    ".png": "image/png",
    ".woff2": "font/woff2",
    ".txt": "text/plain",
}


def frontend_dir() -> str | None:
    """The directory of the `tb_gradmom_frontend` package, found without importing it."""
    try:
        spec = importlib.util.find_spec("tb_gradmom_frontend")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return os.path.realpath(list(spec.submodule_search_locations)[0])
    if spec.origin:
        return os.path.realpath(os.path.dirname(spec.origin))
    return None


def resolve(root: str | None, relpath: str) -> tuple[str, str] | None:
    """``(absolute file path, MIME type)`` of ``relpath`` under ``root``, or None.

    None for anything that is not a plain existing file under ``root`` with a served
    extension: ``..`` or ``.`` segments, hidden files, backslashes, NUL bytes, absolute paths,
    and symlinks leading out of ``root``.
    """
    if root is None or not relpath or len(relpath) > 512:
        return None
    if "\\" in relpath or "\x00" in relpath or relpath.startswith("/"):
        return None
    parts = relpath.split("/")
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        return None
    ext = os.path.splitext(parts[-1])[1].lower()
    mime = MIME_TYPES.get(ext)
    if mime is None:
        return None
    path = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([path, root]) != root or not os.path.isfile(path):
        return None
    return path, mime

"""The ``tb-gradmom`` command: ``export`` (plots and numbers to files) and ``demo``.

    tb-gradmom export --logdir runs/demo --out figures
    tb-gradmom demo --logdir runs/demo --quick
    tb-gradmom demo --mislabelled --logdir runs/demo

Subcommands import their modules lazily, so ``tb-gradmom --help`` is fast and ``export`` never
imports TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def _run_export(args) -> int:
    from tb_gradmom.viz import export

    return export.run_from_args(args)


# TensorFlow's start-up lines on a machine without a GPU: CUDA probing, CPU features, oneDNN.
_STARTUP_NOISE = re.compile(
    r"absl::InitializeLog|cudart_stub|cuInit|cuda_platform|cuda_dnn|cuda_fft|cuda_blas|"
    r"cpu_feature_guard|This TensorFlow binary is optimized|rebuild TensorFlow with|"
    r"oneDNN custom operations|TF_ENABLE_ONEDNN_OPTS|computer_vision_library"
)


def _quiet_tensorflow(stream=None) -> None:
    """Imports TensorFlow with its C++ start-up messages hidden; every other line still shows.

    ``TF_CPP_MIN_LOG_LEVEL=2`` (unless the user set it) hides most of TensorFlow's C++ logging,
    but not the lines printed before its logging is initialised (CUDA probing on a CPU machine
    prints them at import and at the first device listing). Those go to file descriptor 2
    directly, so it is redirected to a file during the import and the device listing, and the
    lines that are not start-up noise are written back to ``stream`` (default stderr).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        return
    stream = stream or sys.stderr
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr is not a file (captured): no redirect
        import tensorflow as tf

        tf.config.list_physical_devices()
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", errors="replace")
    kept = [line for line in text.splitlines() if line.strip() and not _STARTUP_NOISE.search(line)]
    if kept:
        stream.write("\n".join(kept) + "\n")
        stream.flush()


def _run_demo(args) -> int:
    _quiet_tensorflow()
    if getattr(args, "mislabelled", False):
        from tb_gradmom import demo_mislabelled

        return int(demo_mislabelled.main(args) or 0)
    from tb_gradmom import demo

    code = demo.main(args)
    return int(code or 0)


def _statistics_help() -> str:
    """The derived statistics explained (from `stats.STATISTICS`; see docs/math.md)."""
    from tb_gradmom.analysis import stats

    parts = ["statistics of --plot curves (--quantities):"]
    parts += [stats.describe(k) for k in stats.STATISTICS]
    return "\n\n".join(parts)


def _add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write the tab's plots (png, svg, pdf) or their numbers (csv, json) to files",
        description="Write one file per plot: by default a heatmap of the unbiased variance "
        "of every variable at its latest step.",
        epilog=_statistics_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Imported here for the choices; export imports no TensorFlow and no matplotlib.
    from tb_gradmom.viz import export

    export.add_arguments(p)
    p.set_defaults(func=_run_export)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="train a small model and log its gradient moments")
    p.add_argument("--logdir", default="runs/demo", help="where to write (default: runs/demo)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the demo's)")
    p.add_argument("--quick", action="store_true", help="a few steps only, for a smoke test")
    p.add_argument(
        "--mislabelled",
        action="store_true",
        help="instead: train on a finite generated set with 5%% of its labels flipped, log the "
        "per-example gradient norms with the examples' ids, and report how many of the largest "
        "are the flipped ones (their ids in <logdir>/mislabelled/flipped.json)",
    )
    p.set_defaults(func=_run_demo)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tb-gradmom`` with its subcommands."""
    parser = argparse.ArgumentParser(
        prog="tb-gradmom", description="Grad Moments: per-example gradient moments tools."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_export(sub)
    _add_demo(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``tb-gradmom``.

    Args:
      argv: the arguments after the program name; default ``sys.argv[1:]``.

    Returns:
      The exit code (argparse exits with 2 itself on a usage error).
    """
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

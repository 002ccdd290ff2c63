"""The per-example routes: ``/examples/tags``, ``/examples/quantiles``, ``/examples/histogram``,
``/examples/outliers``, ``/examples/clip`` (docs/http_api.md, "Per-example norms").

The per-example norms tags (``_examples``, plugin name ``gradmom_examples``, docs/format.md)
are listed and read through the data provider (``list_tensors`` / ``read_tensors``), the same
calls on the Python loader and on RustBoard (``--load_fast=true``). A run with only such tags
is listed too. A series is read whole (a step is at most ``8 * max_examples * columns`` bytes:
112 KiB for 1024 rows of a 10-layer model, 56 MiB for 500 steps), except over gRPC
(RustBoard), whose replies TensorBoard caps at 256 MiB: there at most `GRPC_READ_BUDGET` bytes
of the largest possible steps are asked for (``downsample``, always with the last step), and a
payload read so says ``"max_steps_read"``. It is decoded into
`data.ExamplesRecord` lists by the same code as `gradmom.data.load_examples`, and kept in the
plugin's cache until the series changes. Every payload is computed by
`tb_gradmom.analysis.examples`, the same functions as `gradmom.plot` and ``tb-gradmom export``.

Nothing read is trusted: a content message that does not parse leaves its tag out (listed
under ``skipped``), a step whose tensors do not fit is skipped (logged), a run whose listing
fails is listed under ``skipped`` and never affects the others. No TensorFlow here.
"""

from __future__ import annotations

import logging
from typing import Any

from tensorboard import errors
from tensorboard.data import provider

from tb_gradmom import metadata
from tb_gradmom.analysis import data
from tb_gradmom.analysis import examples as ex
from tb_gradmom.plugin import _params, _tb_compat

logger = logging.getLogger(__name__)

__all__ = ["ExamplesRoutes", "ROUTES"]

PLUGIN = metadata.EXAMPLES_PLUGIN_NAME
ALL_STEPS = 1_000_000  # `downsample` meaning every stored step
MAX_LIMIT = 10_000  # the most outlier rows one request returns
DEFAULT_LIMIT = 200
MAX_RATIO = 1e12
ROUTES = ("tags", "quantiles", "histogram", "outliers", "clip")
# The most bytes one read asks RustBoard for (its gRPC replies are capped at 256 MiB), counted
# at the largest a step can be: `max_examples` rows of the columns and an 8-byte id.
GRPC_READ_BUDGET = 240 * 1024 * 1024


def _ids_tag(tag: str) -> bool:
    return tag.endswith("/ids")


class ExamplesRoutes:
    """The per-example routes of a `GradMomentsPlugin` (its data provider, cache, threads and
    cached gzip JSON responses)."""

    def __init__(self, plugin: Any):
        self._plugin = plugin
        self._warned: set = set()

    def apps(self) -> dict:
        """``{"/examples/<name>": route}`` for `GradMomentsPlugin.get_plugin_apps`."""
        from tb_gradmom.plugin.plugin import _route  # the plugin imports this module

        routes = {
            "tags": self._tags_route,
            "quantiles": self._quantiles_route,
            "histogram": self._histogram_route,
            "outliers": self._outliers_route,
            "clip": self._clip_route,
        }
        return {f"/examples/{k}": _route(f) for k, f in routes.items()}

    # ------------------------------------------------------------------------- listing

    def _warn(self, run: str, tag: str, step: int, message: str) -> None:
        key = (run, tag, step, message)
        if key not in self._warned and len(self._warned) < 10_000:
            self._warned.add(key)
            logger.warning("Grad Moments: run %r tag %r step %d: %s", run, tag, step, message)

    def listing(self, ctx, experiment: str) -> tuple[dict, dict]:
        """``({run: {tag: (content, TensorTimeSeries)}}, {run: {tag: reason}})``: the examples
        tags (not their ``/ids`` tags) whose content parses, and what was left out."""
        dp = self._plugin._data_provider
        try:
            raw = dp.list_tensors(ctx, experiment_id=experiment, plugin_name=PLUGIN)
        except Exception:  # noqa: BLE001 - one bad series fails the whole listing: go run by run
            raw = {}
            for run in dp.list_runs(ctx, experiment_id=experiment):
                name = run.run_name
                try:
                    raw.update(
                        dp.list_tensors(
                            ctx,
                            experiment_id=experiment,
                            plugin_name=PLUGIN,
                            run_tag_filter=provider.RunTagFilter(runs=[name]),
                        )
                    )
                except Exception as e:  # noqa: BLE001
                    raw[name] = e
        runs: dict = {}
        skipped: dict = {}
        for run, tags in sorted(raw.items()):
            if isinstance(tags, Exception):
                skipped[run] = {"*": f"its per-example tags could not be listed: {tags}"}
                continue
            for tag, ts in sorted(tags.items()):
                if _ids_tag(tag):
                    continue
                try:
                    content = metadata.parse_examples_content(ts.plugin_content)
                except metadata.FormatError as e:
                    skipped.setdefault(run, {})[tag] = str(e)
                    self._warn(run, tag, int(ts.max_step), f"tag skipped: {e}")
                    continue
                runs.setdefault(run, {})[tag] = (content, ts)
        return runs, skipped

    def _entry(self, ctx, experiment: str, run: str, tag: str):
        runs, skipped = self.listing(ctx, experiment)
        if run not in runs:
            why = skipped.get(run, {}).get(tag) or skipped.get(run, {}).get("*")
            raise errors.NotFoundError(
                f"run {run!r} has no per-example norms"
                + (f" ({why})" if why else "")
                + "; they are logged with summary.moments(..., log_examples=True)"
            )
        if tag not in runs[run]:
            why = skipped.get(run, {}).get(tag)
            raise errors.NotFoundError(
                f"run {run!r} has no per-example tag {tag!r}"
                + (f" ({why})" if why else f"; its tags are {sorted(runs[run])}")
            )
        return runs[run][tag]

    def read_steps(self, content) -> int:
        """How many steps one read asks for: every step, or over gRPC as many of the largest
        possible steps as fit `GRPC_READ_BUDGET`."""
        if _tb_compat.is_python_loader(self._plugin._data_provider):
            return ALL_STEPS
        per_step = 8 * content.max_examples * (len(content.columns) + 1)
        return max(1, min(ALL_STEPS, GRPC_READ_BUDGET // per_step))

    def records(self, ctx, experiment: str, run: str, tag: str) -> tuple[list, tuple]:
        """The `data.ExamplesRecord` list of one tag (cached while the series is unchanged),
        and the series' version."""
        content, ts = self._entry(ctx, experiment, run, tag)
        version = (int(ts.max_step), float(ts.max_wall_time))
        steps = self.read_steps(content)
        key = ("examples", experiment, run, tag, steps, version)

        def load():
            dp = self._plugin._data_provider
            ids_tag = metadata.examples_ids_tag(tag)
            got = dp.read_tensors(
                ctx,
                experiment_id=experiment,
                plugin_name=PLUGIN,
                downsample=steps,
                run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag, ids_tag]),
            ).get(run, {})
            tables = {
                t: {int(d.step): (float(d.wall_time), d.numpy) for d in got.get(t, [])}
                for t in (tag, ids_tag)
            }
            return data._examples_of_run(run, {tag: content}, tables, warn=self._warn).get(tag, [])

        recs = self._plugin._cache.get_or_load(key, load, group=key[:-1])
        return recs, version

    # ---------------------------------------------------------------------------- routes

    def _tags_route(self, request):
        ctx, experiment = self._plugin._ctx(request)
        runs, skipped = self.listing(ctx, experiment)
        version = tuple(
            (run, tag, ts.max_step, ts.max_wall_time)
            for run, tags in runs.items()
            for tag, (_, ts) in tags.items()
        ) + tuple((run, tuple(sorted(why.items()))) for run, why in sorted(skipped.items()))
        return self._plugin._cached_json(
            request,
            ("examples/tags", experiment, version),
            lambda: self.tags_impl(ctx, experiment, (runs, skipped)),
            group=("examples/tags", experiment),
        )

    def tags_impl(self, ctx, experiment: str, listed=None) -> dict:
        """``{"runs": {run: {tag: info}}, "skipped": {run: {tag: reason}}, "view": ...}``: every
        run with per-example norms (also those without moments), and what the view shows
        (`analysis.examples.view_info`)."""
        runs, skipped = self.listing(ctx, experiment) if listed is None else listed
        out: dict = {}
        for run, tags in runs.items():
            for tag, (c, ts) in tags.items():
                fixed = len(metadata.EXAMPLE_COLUMNS)
                named = list(zip(c.columns[fixed:], c.norms))
                out.setdefault(run, {})[tag] = {
                    "group": tag[: -len(metadata.EXAMPLES_SUFFIX)].rstrip("/"),
                    "columns": [ex.MODEL] + [n for n, _ in named],
                    "layers": [n for n, k in named if k == "layer"],
                    "variables": [n for n, k in named if k == "variable"],
                    "ids": c.ids,
                    "max_examples": c.max_examples,
                    "max_step": int(ts.max_step),
                }
        return {"runs": out, "skipped": skipped, "view": ex.view_info()}

    def _common(self, request) -> tuple[str, str, str]:
        run = _params.string(request, "run", required=True)
        tag = _params.string(request, "tag", default=metadata.examples_tag()) or "_examples"
        column = _params.string(request, "column", default=ex.MODEL) or ex.MODEL
        return run, tag, column

    def _build(self, ctx, experiment, run, tag, fn):
        recs, _ = self.records(ctx, experiment, run, tag)
        if not recs:
            raise errors.NotFoundError(f"run {run!r} tag {tag!r} has no readable step")
        try:
            payload = self._plugin._compute(lambda: fn(recs))
        except ValueError as e:
            raise errors.InvalidArgumentError(str(e)) from None
        content, _ = self._entry(ctx, experiment, run, tag)
        limit = self.read_steps(content)
        extra = {"max_steps_read": limit} if len(recs) >= limit else {}
        return {"run": run, "tag": tag, **payload, **extra}

    def _respond(self, request, name, params, fn):
        ctx, experiment = self._plugin._ctx(request)
        run, tag = params[0], params[1]
        _, ts = self._entry(ctx, experiment, run, tag)
        key = (name, experiment, *params, (int(ts.max_step), float(ts.max_wall_time)))
        # an error (a bad column or step) propagates and nothing is cached
        return self._plugin._cached_json(
            request, key, lambda: self._build(ctx, experiment, run, tag, fn), group=key[:-1]
        )

    def _quantiles_route(self, request):
        run, tag, column = self._common(request)
        return self._respond(
            request, "examples/quantiles", (run, tag, column), lambda r: ex.quantiles(r, column)
        )

    def _histogram_route(self, request):
        run, tag, column = self._common(request)
        step = _params.step(request)
        per_decade = _params.integer(
            request, "per_decade", default=ex.DEFAULT_PER_DECADE, lo=1, hi=100
        )
        return self._respond(
            request,
            "examples/histogram",
            (run, tag, column, step, per_decade),
            lambda r: ex.histogram(r, step, column, per_decade),
        )

    def _outliers_route(self, request):
        run, tag, column = self._common(request)
        threshold = _params.number(
            request, "threshold", default=ex.DEFAULT_OUTLIER_RATIO, lo=1.0, hi=MAX_RATIO
        )
        limit = _params.integer(request, "limit", default=DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT)
        return self._respond(
            request,
            "examples/outliers",
            (run, tag, column, threshold, limit),
            lambda r: ex.outliers(r, column, threshold, limit),
        )

    def _clip_route(self, request):
        run, tag, column = self._common(request)
        clip = _params.number(request, "clip_norm", default=None, lo=0.0, hi=1e300)
        if clip is None or clip <= 0:
            raise errors.InvalidArgumentError(
                "parameter `clip_norm` (the clipping norm C, a positive number) is required"
            )
        return self._respond(
            request,
            "examples/clip",
            (run, tag, column, clip),
            lambda r: ex.clipped(r, clip, column),
        )

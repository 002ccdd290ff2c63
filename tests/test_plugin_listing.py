"""The plugin's tag listings with TensorBoard's Python loader: kept between requests while the
multiplexer's data is unchanged (its scans of every series were 17 % of TensorBoard's CPU time
under 200 clients), and listed again as soon as a run gains a step, a tag or a run, or after
`LISTING_MAX_AGE` seconds."""

from __future__ import annotations

import os
import sys

from tb_gradmom.plugin import _tb_compat

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_readers as trd  # noqa: E402
import test_robustness as tr  # noqa: E402
from test_plugin import make_app  # noqa: E402


def _counting(provider):
    calls = []
    listed = provider.list_tensors

    def list_tensors(*args, **kwargs):
        calls.append(kwargs.get("run_tag_filter"))
        return listed(*args, **kwargs)

    provider.list_tensors = list_tensors
    return calls


def test_listing_is_kept_while_the_data_is_unchanged_and_listed_again_when_it_changes(
    tmp_path, monkeypatch
):
    root = str(tmp_path)
    trd._good_run(root, "a")  # noqa: SLF001
    client, plugin, _ = make_app(root)
    mux = plugin._reader._mux  # noqa: SLF001 - the multiplexer TensorBoard reloads
    calls = _counting(plugin._data_provider)  # noqa: SLF001
    complete = tr.STEPS[-1]

    first = trd._json(client, "tags")  # noqa: SLF001
    assert first["runs"]["a"][tr.OK]["steps"][-1] == complete
    for _ in range(3):
        assert trd._json(client, "tags") == first  # noqa: SLF001
    assert len(calls) == 1, "an unchanged multiplexer was listed again"
    version = _tb_compat.listing_version(mux)
    assert version is not None and version == _tb_compat.listing_version(mux)

    # A new step (moments, then its stats) in the run: listed by the next request.
    path = os.path.join(root, "a")
    trd._append(path, [trd._moments_event("a", tr.OK, complete + 1)])  # noqa: SLF001
    trd._append(path, trd._stats_events("a", tr.OK, complete + 1))  # noqa: SLF001
    mux.Reload()
    assert _tb_compat.listing_version(mux) != version
    d = trd._json(client, "tags")  # noqa: SLF001
    assert d["runs"]["a"][tr.OK]["steps"][-1] == complete + 1
    assert len(calls) == 2
    heat = trd._json(client, "heatmap", run="a", tag=tr.OK, stat="mean")  # noqa: SLF001
    assert heat["step"] == complete + 1

    # A new run: listed by the next request.
    trd._good_run(root, "b")  # noqa: SLF001
    mux.AddRunsFromDirectory(root)
    mux.Reload()
    assert sorted(trd._json(client, "tags")["runs"]) == ["a", "b"]  # noqa: SLF001

    # Nothing changed, but the listing is older than the limit: listed again.
    before = len(calls)
    trd._json(client, "tags")  # noqa: SLF001
    assert len(calls) == before
    monkeypatch.setattr(type(plugin._reader), "LISTING_MAX_AGE", 0.0)  # noqa: SLF001
    trd._json(client, "tags")  # noqa: SLF001
    assert len(calls) == before + 1


def test_a_step_written_again_after_a_restart_changes_the_version(tmp_path):
    """A writer restarted from an earlier step writes steps the run already has (TensorBoard may
    purge the later ones): no series is new, but the version changes and the next request lists
    again."""
    root = str(tmp_path)
    trd._good_run(root, "a")  # noqa: SLF001
    client, plugin, _ = make_app(root)
    mux = plugin._reader._mux  # noqa: SLF001
    calls = _counting(plugin._data_provider)  # noqa: SLF001
    trd._json(client, "tags")  # noqa: SLF001
    version = _tb_compat.listing_version(mux)
    restart = tr.STEPS[1]
    events = [trd._moments_event("a", tr.OK, restart), *trd._stats_events("a", tr.OK, restart)]  # noqa: SLF001
    trd._append(os.path.join(root, "a"), events)  # noqa: SLF001
    mux.Reload()
    assert _tb_compat.listing_version(mux) != version
    trd._json(client, "tags")  # noqa: SLF001
    assert len(calls) == 2


def test_text_exports_are_kept_gzipped_and_sent_as_asked(tmp_path):
    """A CSV or JSON export is compressed once and kept so (TensorBoard compressed it again for
    every request): a client that accepts gzip gets it compressed, one that does not gets the
    same text uncompressed."""
    import gzip

    root = str(tmp_path)
    trd._good_run(root, "a")  # noqa: SLF001
    client, _, _ = make_app(root)
    q = {"run": "a", "tag": tr.OK, "what": "heatmap", "format": "csv", "stat": "mean"}
    plain = client.get(trd.P + "export", query_string=q)
    assert plain.status_code == 200 and "Content-Encoding" not in plain.headers
    text = plain.get_data()
    assert text.startswith(b"row,0,")
    for _ in range(2):
        r = client.get(trd.P + "export", query_string=q, headers={"Accept-Encoding": "gzip"})
        assert r.status_code == 200 and r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(r.get_data()) == text
        assert r.headers["Content-Type"].startswith("text/csv")
    npy = client.get(
        trd.P + "export", query_string={**q, "format": "npy"}, headers={"Accept-Encoding": "gzip"}
    )
    assert npy.status_code == 200 and "Content-Encoding" not in npy.headers

"""tests/js/meta.json: the node tests' copy of the plugin's ``GET /meta`` (`tb_gradmom.analysis.views.meta`).

The tab takes its labels, statistic orders, palettes and defaults from ``/meta`` at start-up;
its node tests (no server) read them from this file instead. After a change to what
`views.meta` returns, rewrite it from the repository root:

    python tests/js/meta_fixture.py            # rewrite tests/js/meta.json
    python tests/js/meta_fixture.py --check    # exit 1 if it differs from views.meta()

``tests/test_stats.py::test_the_tabs_meta_fixture_is_views_meta`` fails while it differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PATH = Path(__file__).with_name("meta.json")


def text() -> str:
    """The fixture's text: `views.meta` as indented JSON, key order kept, UTF-8 as is."""
    from tb_gradmom.analysis import views

    return json.dumps(views.meta(), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def main(argv: list[str]) -> int:
    want = text()
    if "--check" in argv:
        if PATH.read_text("utf-8") != want:
            print(f"{PATH} differs from views.meta(); run: python {__file__}", file=sys.stderr)
            return 1
        return 0
    PATH.write_text(want, "utf-8")
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main(sys.argv[1:]))

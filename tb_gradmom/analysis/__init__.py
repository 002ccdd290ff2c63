"""Analysis (numpy only, no TensorFlow): reading logs (`data`), element-wise statistics
(`reductions`), the noise statistics (`stats`), what is shown (`views`) and the one JSON/CSV
encoder and file-name rule (`encode`). Shared by the plugin, the figures and the export; the
no-TensorFlow boundary is checked by tests/test_boundaries.py."""

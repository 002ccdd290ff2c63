"""Writers (TensorFlow): `summary` logs moments and statistics as tensor summaries from a
training step, `keras` does it from a Keras callback. Public as `tb_gradmom.summary` and
`tb_gradmom.keras`."""

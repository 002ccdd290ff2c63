"""Figures and export (numpy and matplotlib, no TensorFlow): `plot` draws the tab's views as
matplotlib figures, `export` writes every figure and its data (`tb-gradmom export`)."""

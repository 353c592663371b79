"""Watching a run: TensorBoard logging, the progress bar, step metrics read without host syncs."""

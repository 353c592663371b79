"""A run around search and training: run directory, checkpoints, resume, signals, exit codes."""

"""What search and training share below them: process groups, gradient averaging, RNG state."""

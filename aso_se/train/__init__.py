"""Retraining a genotype from scratch: eager and CUDA-graph training steps."""

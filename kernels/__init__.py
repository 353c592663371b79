"""Triton kernels with readable torch references; imports only torch and triton."""

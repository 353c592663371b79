"""Triton kernels with readable torch references; imports only torch and triton.

Every kernel package (st_bif, quantizer, pool3x3, weighted_sum, sparse_conv) has one shape:
  __init__.py   the public face: what the package offers, in ``__all__``; a function whose backend choice is one
                call of backend.py is defined here
  dispatch.py   where the choice is remembered per kind of call instead (st_bif's routes, sparse_conv's calibrated
                "auto"), with the functions that make it
  reference.py  the readable torch reference: the ground truth the tests compare with
  triton.py     the Triton kernels and their launchers
  function.py   the autograd: an autograd.Function, and the custom ops torch.compile traces where there are any
  module.py     the nn.Module, where there is one
and modules named for what else it holds (st_bif: surrogates, validation; sparse_conv: geometry, prescan, packed,
calibration, dense). native/ is the C++ node the neurons launch their compiled kernels through; the other modules
here are what several packages share (launches, block maps, memory orders, partial sums, dependent launches).
"""

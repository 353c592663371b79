"""The ASO-SE algorithm, one module per part:

- ``engine``: the plan of cycles (``schedule``), the epoch loop and its callbacks, evolution, resume;
- ``epoch_metrics``: the loop's step metrics on their way to the host and its epoch sums;
- ``trained_supernet``: the supernet with its optimizers and LR schedule, replaced together when it grows;
- ``step``: one training step, an α step then a weight step, and the draw-ahead that pipelines its draws;
- ``supernet``: the searched network, its cells and the node sums (the relaxation);
- ``mixed_op``: FastMixedOp, an edge that runs only its sampled ops;
- ``op_runner``: how those ops run, eagerly or (``graphed_ops``) replayed from CUDA graphs;
- ``recompute``: a cell's activations recomputed in backward instead of stored;
- ``arch_params``: α, the sampling knobs and the batched Gumbel top-k draw;
- ``architect``: the first- and second-order α gradients;
- ``energy_cost``, ``fast_math``: the spike-aware energy term, entropy and KL of α;
- ``firing_rates``: firing rates recorded on chosen steps only;
- ``derive``: the genotype from α; ``evolution``: pruning and how much to grow; ``growth``: deeper and wider
  supernets; ``strength``: the final cell from the ops' strengths instead of α (``derive=strength``).
"""

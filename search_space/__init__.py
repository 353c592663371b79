"""What can be searched: neurons, the op registry, cells, networks and genotypes."""

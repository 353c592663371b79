"""ASO-SE: how the spiking search space is searched (engine, training loop, data, logging)."""

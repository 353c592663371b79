"""The ASO-SE algorithm: supernet, FastMixedOp, architecture parameters, engine, evolution."""

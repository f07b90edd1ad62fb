"""Analysis layer (numpy only): the rules of procedures and configs, Gram metrics, diagnosis, the regime guard,
mismatch cost, seeds."""

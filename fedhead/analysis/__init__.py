"""Analysis layer (numpy only): procedures, Gram metrics, diagnosis, the regime guard, mismatch cost, seeds."""

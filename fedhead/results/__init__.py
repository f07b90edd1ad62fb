"""Results layer (numpy and json only): atomic writing, provenance and the results.json schema."""

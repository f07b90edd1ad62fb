"""The run configuration: the typed settings a run is built from, composed and read once."""

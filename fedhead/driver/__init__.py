"""Driver layer: the simulation, the ServerApp body, Ray, the run recorder, console, logs, TensorBoard, errors."""

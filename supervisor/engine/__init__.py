"""Engine layer: the backend Protocol, the Docker backend, procfs, the probe, the fake engine."""

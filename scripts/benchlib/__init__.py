"""The parts of scripts/bench.py: the dataset, the mounts and servers, the readers measured,
Petastorm's side interpreter, the stall experiment and the report."""

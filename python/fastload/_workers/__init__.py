"""workers="processes": the pool of spawned worker processes on the Loader's side (pool.py) and what
each worker runs (process.py)."""

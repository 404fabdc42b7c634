"""Everything a Loader can read, one module per kind of source, each implementing the Source
protocol (protocol.py). Nothing here imports the Loader; the public names are re-exported by
fastload/__init__.py."""

"""Sources the Loader reads natively, one module per kind of data."""

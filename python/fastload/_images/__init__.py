"""The image decode stage's Python side: `fl.Image` (spec.py: what the native decoder makes of each
encoded image), the PIL fallback for formats this build does not decode natively (fallback.py), and
which stored Arrow/Parquet columns hold a decoded column's bytes (columns.py). The decoding itself
is native (csrc/image/)."""

"""Column machinery shared by the sources: what a column is to the core (spec.py: user arrays
validated and described as ColumnSpec), columns made of several arrays (shards.py), ragged columns
(ragged.py), files mapped lazily (mapping.py), and what each Arrow column becomes in a batch
(arrow_types.py). Nothing here is a source or imports one; the sources in _sources/ build on it."""

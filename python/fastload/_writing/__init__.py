"""Writing dataset directories (writer.py: write_dataset, DatasetWriter) and putting a finished one
in place atomically for readers (replace.py). Reading them is _sources/directory.py."""

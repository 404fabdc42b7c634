"""Everything a Loader can read, one module per kind of source (with the helpers that belong to one
kind only: parquet_footer.py and hive.py to Parquet, tar_index_cache.py and tar_urls.py to Tar,
manifest.py and window_layout.py to dataset directories and windows), each implementing the Source
protocol (protocol.py). Column machinery shared by several kinds is in _columns/, the image decode
stage's Python side in _images/, writing dataset directories in _writing/, worker processes in
_workers/. Nothing here imports the Loader; the public names are re-exported by
fastload/__init__.py."""

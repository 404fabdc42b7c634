"""fastload: a data loader for PyTorch whose sampling, collation and transfers run in C++."""
from ._dataset import Dataset, Windows
from ._disk import DatasetError, DiskDataset
from ._loader import Loader, LoaderIterator
from ._mix import Mix
from ._python_source import PythonSource, SampleError, sample_rng
from ._ragged import Ragged
from ._source import Source
from ._state import STATE_VERSION
from ._stats import LoaderStats, SourceStats, StageStats
from ._streams import record_stream
from ._tune import TunePoint, TuneResult, tune
from ._version import __version__
from ._writer import DatasetWriter, write_dataset

__all__ = ["Dataset", "Windows", "Ragged", "DiskDataset", "DatasetError", "DatasetWriter", "write_dataset",
           "Loader", "LoaderIterator", "Mix", "record_stream", "Source", "PythonSource", "SampleError", "sample_rng",
           "LoaderStats", "SourceStats", "StageStats", "STATE_VERSION",
           "tune", "TuneResult", "TunePoint", "__version__"]

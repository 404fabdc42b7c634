"""fastload: a data loader for PyTorch whose sampling, collation and transfers run in C++."""
from . import _C, _advice, _gpu_memory
from ._loader import Loader, LoaderIterator
from ._sources.arrays import Dataset, Windows
from ._sources.directory import DatasetError
from ._sources.directory_source import DiskDataset
from ._sources.mix import Mix
from ._sources.protocol import Source
from ._sources.python import PythonSource, SampleError, sample_rng
from ._columns.ragged import Ragged
from ._writing.writer import DatasetWriter, write_dataset
from ._state import STATE_VERSION
from ._stats import LoaderStats, PackingStats, SourceStats, StageStats
from ._sources.arrow import Arrow
from ._sources.parquet import Parquet
from ._images.spec import Image, ImageError, image_backends
from ._sources.image_folder import ImageFolder
from ._sources.pack import Pack
from ._sources.tar import Tar
from ._record_stream import record_stream
from .tools.tune import TunePoint, TuneResult, tune
from ._version import __version__

# The Python objects the native module calls back into, handed over once (csrc/bindings/hooks.h).
_C._register_hooks(sample_error=SampleError, release_cache=_gpu_memory.release_cached,
                   stall_warning=_advice.stall_warning)
_C._register_image_error(ImageError)

__all__ = ["Dataset", "Windows", "Ragged", "Arrow", "Parquet", "Pack", "DiskDataset", "DatasetError", "DatasetWriter", "write_dataset",
           "Image", "ImageFolder", "ImageError", "image_backends", "Tar",
           "Loader", "LoaderIterator", "Mix", "record_stream", "Source", "PythonSource", "SampleError", "sample_rng",
           "LoaderStats", "SourceStats", "StageStats", "PackingStats", "STATE_VERSION",
           "tune", "TuneResult", "TunePoint", "__version__"]

// FileMapping: a whole file mapped read-only. Python's mmap.mmap (and np.memmap, which uses it)
// keeps a duplicate of the file's descriptor for as long as the mapping lives, so 100,000 mapped
// shards need 100,000 descriptors and fail under the usual `ulimit -n 1024`. A mapping does not
// need its descriptor after mmap(): this one opens, fstats, maps and closes at once, exposes the
// bytes through the buffer protocol (np.frombuffer keeps the object alive) and unmaps when the
// last reference dies.
//
// FileSet: (st_dev, st_ino, st_mtime_ns, st_size) of many paths in one call without the GIL, so
// the per-iter() check that no shard was truncated or replaced costs a stat per file and no
// Python per file.
//
// MappingCache and LazyFiles (core/lazy_mappings.h): files the collation threads map on demand,
// a bounded number at a time, for sources of more files than the process may map at once.
#include "bindings/file_mapping.h"

#include "bindings/callback_error.h"
#include "bindings/python_ref.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/lazy_mappings.h"

namespace py = pybind11;

namespace fastload {
namespace {

[[noreturn]] void raise_errno(int err, const std::string& path) {
  errno = err;
  PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
  throw py::error_already_set();
}

class FileMapping {
 public:
  explicit FileMapping(std::string path) : path_(std::move(path)) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) raise_errno(errno, path_);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      raise_errno(err, path_);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw py::value_error(path_ + ": not a regular file; only regular files can be mapped");
    }
    dev_ = static_cast<int64_t>(st.st_dev);
    ino_ = static_cast<int64_t>(st.st_ino);
    mtime_ns_ = mtime_ns(st);
    length_ = static_cast<size_t>(st.st_size);
    if (length_ > 0) {
      void* p = ::mmap(nullptr, length_, PROT_READ, MAP_SHARED, fd, 0);
      const int err = errno;
      ::close(fd);
      if (p == MAP_FAILED) raise_errno(err, path_);
      addr_ = p;
    } else {
      ::close(fd);  // an empty file maps to an empty buffer
    }
  }
  ~FileMapping() {
    if (addr_ != nullptr) ::munmap(addr_, length_);
  }
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  // The mapped file's size now: a stat of the path, if the path still names the mapped file.
  // A file replaced by another (renamed over) keeps the mapped one alive, unchanged in size.
  int64_t size() const {
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0 && static_cast<int64_t>(st.st_dev) == dev_ &&
        static_cast<int64_t>(st.st_ino) == ino_) {
      return static_cast<int64_t>(st.st_size);
    }
    return static_cast<int64_t>(length_);
  }

  py::buffer_info buffer() {
    static std::byte empty{};
    void* p = addr_ != nullptr ? addr_ : static_cast<void*>(&empty);
    return py::buffer_info(p, 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(length_)}, {static_cast<py::ssize_t>(1)},
                           /*readonly=*/true);
  }

  const std::string& path() const { return path_; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(addr_); }
  int64_t length() const { return static_cast<int64_t>(length_); }
  py::tuple identity() const {
    return py::make_tuple(dev_, ino_, mtime_ns_, static_cast<int64_t>(length_));
  }

 private:
  std::string path_;
  void* addr_ = nullptr;
  size_t length_ = 0;
  int64_t dev_ = 0, ino_ = 0, mtime_ns_ = 0;
};

class FileSet {
 public:
  explicit FileSet(std::vector<std::string> paths) : paths_(std::move(paths)) {}

  // One row per path: (st_dev, st_ino, st_mtime_ns, st_size), or (-1, errno, 0, -1) when the
  // stat fails. Regular files only: anything else reads as (-1, EINVAL, 0, -1).
  py::array_t<int64_t> stat() const {
    const size_t n = paths_.size();
    py::array_t<int64_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(4)});
    int64_t* row = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      for (size_t i = 0; i < n; ++i, row += 4) {
        struct stat st {};
        int err = 0;
        if (::stat(paths_[i].c_str(), &st) != 0) {
          err = errno;
        } else if (!S_ISREG(st.st_mode)) {
          err = EINVAL;
        }
        if (err != 0) {
          row[0] = -1, row[1] = err, row[2] = 0, row[3] = -1;
          continue;
        }
        row[0] = static_cast<int64_t>(st.st_dev);
        row[1] = static_cast<int64_t>(st.st_ino);
        row[2] = mtime_ns(st);
        row[3] = static_cast<int64_t>(st.st_size);
      }
    }
    return out;
  }
  size_t size() const { return paths_.size(); }

 private:
  std::vector<std::string> paths_;
};

// files: (n, 6) int64 rows of (data offset, data bytes, st_dev, st_ino, st_mtime_ns, st_size).
std::shared_ptr<LazyFiles> make_lazy_files(std::shared_ptr<MappingCache> cache, std::vector<std::string> paths,
                                           const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& files) {
  if (files.ndim() != 2 || files.shape(1) != 6 || static_cast<size_t>(files.shape(0)) != paths.size())
    throw py::value_error("files must be an (n, 6) int64 array, one row per path");
  std::vector<LazyFile> out(paths.size());
  const int64_t* row = files.data();
  for (size_t i = 0; i < paths.size(); ++i, row += 6) {
    out[i].path = std::move(paths[i]);
    out[i].offset = row[0];
    out[i].bytes = row[1];
    out[i].identity = {row[2], row[3], row[4], row[5]};
  }
  return std::make_shared<LazyFiles>(std::move(cache), std::move(out));
}

// The provider of files fetched on demand: a Python callable (file index -> (st_dev, st_ino,
// st_mtime_ns, st_size)) called on a collation thread with the GIL taken there. Its Python
// exception becomes a std::runtime_error carrying the message (next() raises it as RuntimeError);
// the callable is released with the GIL held, whichever thread drops the last LazyFiles.
void set_provider(LazyFiles& files, py::function fn) {
  std::shared_ptr<PyObject> held(fn.release().ptr(), [](PyObject* p) {
    if (!Py_IsInitialized()) return;  // at exit: leak it rather than touch a finalized interpreter
    GilScope gil;
    Py_DECREF(p);
  });
  files.set_provider([held](int32_t i) {
    GilScope gil;
    try {
      py::object r = py::reinterpret_borrow<py::object>(held.get())(i);
      auto t = r.cast<std::tuple<int64_t, int64_t, int64_t, int64_t>>();
      return FileIdentity{std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
    } catch (py::error_already_set& e) {
      if (keeps_type(e)) throw callback_error(e);  // an object deleted from its bucket: FileNotFoundError
      std::string message = py::str(e.value());
      throw std::runtime_error(message);
    } catch (const py::cast_error& e) {
      throw std::runtime_error(std::string("the file provider returned no identity: ") + e.what());
    }
  });
}

py::dict stats_dict(const MappingCache& c) {
  const MappingCache::Stats s = c.stats();
  py::dict d;
  d["budget"] = s.budget;
  d["live"] = s.live;
  d["pinned"] = s.pinned;
  d["peak_live"] = s.peak_live;
  d["peak_pinned"] = s.peak_pinned;
  d["peak_excess"] = s.peak_excess;
  d["maps"] = s.maps;
  d["evictions"] = s.evictions;
  d["failures"] = s.failures;
  return d;
}

}  // namespace

void register_file_mapping(py::module_& m) {
  py::class_<FileMapping, std::shared_ptr<FileMapping>>(m, "FileMapping", py::buffer_protocol(),
                                                        "A file mapped read-only, holding no descriptor")
      .def(py::init<std::string>(), py::arg("path"))
      .def_buffer(&FileMapping::buffer)
      .def("size", &FileMapping::size, "the mapped file's size now (stat of its path)")
      .def("__len__", &FileMapping::length)
      .def_property_readonly("path", &FileMapping::path)
      .def_property_readonly("address", &FileMapping::address, "where byte 0 is mapped (0 if empty)")
      .def_property_readonly("identity", &FileMapping::identity,
                             "(st_dev, st_ino, st_mtime_ns, st_size) when mapped");
  py::class_<FileSet>(m, "FileSet", "Many paths, stat'ed in one call")
      .def(py::init<std::vector<std::string>>(), py::arg("paths"))
      .def("stat", &FileSet::stat)
      .def("__len__", &FileSet::size);
  py::class_<MappingCache, std::shared_ptr<MappingCache>>(
      m, "MappingCache", "The budget of live mappings that lazily mapped files share (LRU, with pins)")
      .def(py::init<int64_t>(), py::arg("budget"))
      .def_property_readonly("budget", &MappingCache::budget)
      .def("stats", &stats_dict,
           "live, pinned, peak_live, peak_pinned, peak_excess (live - budget - pinned at most), maps, evictions, "
           "failures");
  py::class_<LazyFiles, std::shared_ptr<LazyFiles>>(m, "LazyFiles",
                                                    "Files mapped by the collation threads when a batch needs them")
      .def(py::init(&make_lazy_files), py::arg("cache"), py::arg("paths"), py::arg("files"))
      .def_property_readonly("cache", &LazyFiles::cache)
      .def("set_provider", &set_provider, py::arg("provider"),
           "provider(i) -> (st_dev, st_ino, st_mtime_ns, st_size): called on a collation thread before file i "
           "is mapped; makes the file present (a fetch) and returns the identity to check; set before any use")
      .def("try_unmap", &LazyFiles::try_unmap, py::arg("file"),
           "unmaps the file unless a thread pins or maps it now; True if it is unmapped (its file may go)")
      .def("rows_read", &LazyFiles::rows_read, py::arg("files"),
           "rows the collation threads have copied from each of these files so far (counted as they unpin it)")
      .def_property(
          "pin_bound", &LazyFiles::pin_bound,
          [](LazyFiles& f, int files) {
            if (files < 1) throw py::value_error("pin_bound must be at least 1, got " + std::to_string(files));
            f.set_pin_bound(files);
          },
          "the most files a collation thread pins at once (a block of more is copied in runs of rows)")
      .def("__len__", &LazyFiles::size);
}

}  // namespace fastload

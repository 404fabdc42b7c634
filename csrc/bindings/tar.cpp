// fastload._C's tar shards: the index of one shard (tar_index.h) as numpy arrays, and TarSource
// (fl.Tar's native source) over the sample table Python assembled from the shards' indexes.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings/image.h"
#include "bindings/register.h"
#include "bindings/source.h"
#include "bindings/without_gil.h"
#include "core/npy_header.h"
#include "core/tar_index.h"
#include "image/tar_source.h"

namespace py = pybind11;

namespace fastload {

namespace {

template <typename T>
py::array_t<T> array_of(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

using Int64s = py::array_t<int64_t, py::array::c_style>;

const int64_t* checked(const py::object& h, py::ssize_t size, const char* what) {
  const Int64s a = py::cast<Int64s>(h);
  if (a.size() != size) throw std::invalid_argument(std::string("tar samples: ") + what + " has the wrong size");
  return a.data();
}

image::TarFieldKind kind_of(const std::string& k) {
  if (k == "int") return image::TarFieldKind::kInt;
  if (k == "npy") return image::TarFieldKind::kNpy;
  if (k == "image") return image::TarFieldKind::kImage;
  if (k == "text") return image::TarFieldKind::kText;
  if (k == "json") return image::TarFieldKind::kJson;
  if (k == "bytes") return image::TarFieldKind::kBytes;
  if (k == "key") return image::TarFieldKind::kKey;
  throw std::invalid_argument("unknown tar field kind '" + k + "'");
}

}  // namespace

void register_tar(py::module_& m) {
  m.def("tar_index", [](const std::string& path) {
    int64_t size = 0;
    TarSamples t = without_gil([&] { return index_tar_file(path, &size); });
    const auto n = static_cast<py::ssize_t>(t.samples()), f = static_cast<py::ssize_t>(t.fields.size());
    py::dict d;
    d["fields"] = t.fields;
    d["keys"] = array_of(std::vector<uint8_t>(t.keys.begin(), t.keys.end()), {static_cast<py::ssize_t>(t.keys.size())});
    d["key_offsets"] = array_of(t.key_offsets, {n + 1});
    d["offsets"] = array_of(t.offsets, {n, f});
    d["sizes"] = array_of(t.sizes, {n, f});
    d["skipped_members"] = t.skipped_members;
    d["size"] = size;
    return d;
  }, py::arg("path"),
     "The samples of one tar shard: {fields, keys (uint8), key_offsets, offsets and sizes (samples x fields, "
     "-1 where missing), skipped_members, size}. ValueError naming the shard and offset for a bad tar.");

  m.def("_tar_members", [](const py::bytes& data, const std::string& shard) {
    const std::string bytes(data);
    std::vector<TarMember> members =
        list_tar_members(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), shard);
    py::list out;
    for (const TarMember& t : members) out.append(py::make_tuple(py::bytes(t.name), t.offset, t.size));
    return out;
  }, py::arg("data"), py::arg("shard"), "Test instrument: (name, data offset, size) of each regular member.");

  m.def("_npy_header", [](const py::bytes& data) {
    const std::string bytes(data);
    NpyHeader h;
    std::string why;
    if (!parse_npy_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &h, &why))
      throw std::invalid_argument(why);
    return py::make_tuple(h.descr, h.fortran_order, h.shape, h.data_offset);
  }, py::arg("data"), "(descr, fortran_order, shape, data offset) of a .npy file's header.");

  // files: the LazyFiles of the shards' files; shards (names), sizes, files (index in `files`):
  // per shard; starts: shards + 1; offsets, sizes: samples x columns int64; keys: uint8;
  // key_offsets: samples + 1; fields: (name, kind, column, npy descr, npy shape, (dl code,
  // bits), Image.native() or None) each; fallback: the image fallback or None.
  m.def("TarSource", [](const py::object& files, std::vector<std::string> shards, std::vector<int64_t> shard_sizes,
                        std::vector<int32_t> shard_files, std::vector<int64_t> shard_starts, const py::object& offsets,
                        const py::object& sizes, const py::object& keys, const py::object& key_offsets,
                        const py::list& fields, const py::object& fallback) {
    image::TarSampleTable table;
    table.shards = std::move(shards);
    table.shard_sizes = std::move(shard_sizes);
    table.shard_files = std::move(shard_files);
    table.shard_starts = std::move(shard_starts);
    const py::ssize_t n = table.shard_starts.empty() ? 0 : table.shard_starts.back();
    const Int64s off = py::cast<Int64s>(offsets);
    if (off.ndim() != 2 || off.shape(0) != n) throw std::invalid_argument("tar samples: offsets must be samples x columns");
    table.columns = off.shape(1);
    table.offsets = off.data();
    table.sizes = checked(sizes, off.size(), "sizes");
    const auto key_bytes = py::cast<py::array_t<uint8_t, py::array::c_style>>(keys);
    table.keys = reinterpret_cast<const char*>(key_bytes.data());
    table.key_offsets = checked(key_offsets, n + 1, "key_offsets");
    if (n > 0 && (table.key_offsets[0] < 0 || table.key_offsets[n] > key_bytes.size()))
      throw std::invalid_argument("tar samples: key offsets past the keys");
    std::vector<image::TarField> list;
    for (const py::handle& h : fields) {
      const py::tuple t = py::reinterpret_borrow<py::tuple>(h);
      image::TarField f;
      f.name = t[0].cast<std::string>();
      f.kind = kind_of(t[1].cast<std::string>());
      f.column = t[2].cast<int64_t>();
      f.npy_descr = t[3].cast<std::string>();
      f.npy_shape = t[4].cast<std::vector<int64_t>>();
      const py::tuple dt = t[5].cast<py::tuple>();
      f.dtype = {dt[0].cast<uint8_t>(), dt[1].cast<uint8_t>()};
      if (f.kind == image::TarFieldKind::kImage) f.spec = image_spec_from(t[6].cast<py::tuple>());
      list.push_back(std::move(f));
    }
    auto source = std::make_shared<image::TarSource>(std::move(table), files.cast<std::shared_ptr<LazyFiles>>(),
                                                     std::move(list), image_fallback_from(fallback));
    return SourceHandle{std::move(source), py::make_tuple(files, offsets, sizes, keys, key_offsets, fallback)};
  }, py::arg("files"), py::arg("shards"), py::arg("shard_sizes"), py::arg("shard_files"), py::arg("shard_starts"), py::arg("offsets"),
     py::arg("sizes"), py::arg("keys"), py::arg("key_offsets"), py::arg("fields"), py::arg("fallback"));
}

}  // namespace fastload

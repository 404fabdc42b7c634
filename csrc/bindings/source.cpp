// fastload._C.BatchSource, ArraySource (from the Python side's array descriptions, read by field
// name) and BatchLayout (the one owner of a batch's parts, names and sizes).
#include "bindings/source.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

#include "bindings/gc_visible.h"
#include "bindings/register.h"
#include "core/array_source.h"
#include "core/batch_layout.h"
#include "core/mix_source.h"

namespace py = pybind11;

namespace fastload {

namespace {

const std::byte* address(const py::handle& h) { return reinterpret_cast<const std::byte*>(h.cast<uintptr_t>()); }

std::vector<int32_t> int32s(const py::handle& h) {
  const auto a = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(h);
  if (!a || a.ndim() != 1) throw py::value_error("expected a 1-D array of file numbers");
  return std::vector<int32_t>(a.data(), a.data() + a.shape(0));
}

// One column from a fastload._columns.spec.ColumnSpec (a NamedTuple; see there for the fields).
ArrayColumn column_from(const py::handle& d) {
  ArrayColumn c;
  c.name = d.attr("name").cast<std::string>();
  c.dtype = {d.attr("dl_code").cast<uint8_t>(), d.attr("bits").cast<uint8_t>()};
  c.row_shape = d.attr("row_shape").cast<std::vector<int64_t>>();
  c.base = address(d.attr("address"));
  c.rows = d.attr("rows").cast<int64_t>();
  c.pitch = d.attr("pitch").cast<int64_t>();
  c.row_bytes = d.attr("row_bytes").cast<int64_t>();
  const py::tuple ragged = d.attr("ragged");
  if (py::len(ragged) > 0) {  // (item_bytes, pad element bytes)
    c.ragged = true;
    c.item_bytes = ragged[0].cast<int64_t>();
    const std::string pad = ragged[1].cast<std::string>();
    c.pad.resize(pad.size());
    std::memcpy(c.pad.data(), pad.data(), pad.size());
  }
  const py::tuple shards = d.attr("shards");
  if (py::len(shards) > 0 || c.ragged) {  // ((address, rows, pitch, offsets_address, items), ...)
    std::vector<Shard> table;
    for (const py::handle& sh : shards) {
      const py::tuple u = py::reinterpret_borrow<py::tuple>(sh);
      table.push_back({address(u[0]), u[1].cast<int64_t>(), u[2].cast<int64_t>(),
                       reinterpret_cast<const int64_t*>(u[3].cast<uintptr_t>()), u[4].cast<int64_t>()});
    }
    if (py::hasattr(d, "shard_labels")) c.shard_labels = d.attr("shard_labels").cast<std::vector<std::string>>();
    // (LazyFiles, file per shard, offsets file per shard, longest) for shards mapped on demand.
    const py::tuple lazy = d.attr("lazy");
    if (py::len(lazy) > 0) {
      c.longest = lazy[3].cast<int64_t>();
      set_lazy_shards(c, std::move(table), lazy[0].cast<std::shared_ptr<LazyFiles>>(), int32s(lazy[1]),
                      int32s(lazy[2]));
    } else {
      set_shards(c, std::move(table));
    }
  }
  return c;
}

py::list schema_list(const std::vector<PartSchema>& parts) {
  py::list out;
  for (const PartSchema& p : parts)
    out.append(py::make_tuple(p.name, py::make_tuple(p.dtype.code, p.dtype.bits), p.row_shape, p.row_bytes));
  return out;
}

}  // namespace

void register_sources(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const BatchTooLarge& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  py::class_<SourceHandle>(m, "BatchSource",
                           "A source the native engine reads: its parts (schema) and the objects it keeps alive.",
                           gc_visible<SourceHandle>())
      .def_property_readonly("schema", [](const SourceHandle& s) { return schema_list(s.source->schema()); },
                             "[(name, (dlpack code, bits), row_shape, row_bytes)] of every part it fills")
      .def_property_readonly("names", [](const SourceHandle& s) {
        std::vector<std::string> names;
        for (const PartSchema& p : s.source->schema()) names.push_back(p.name);
        return names;
      })
      .def("__len__", [](const SourceHandle& s) { return s.source->size(); });

  // columns: fastload._columns.spec.ColumnSpec descriptions; owners: what keeps their memory alive.
  m.def("ArraySource", [](const py::list& columns, py::object owners) {
    std::vector<ArrayColumn> cols;
    for (const py::handle& h : columns) cols.push_back(column_from(h));
    return SourceHandle{std::make_shared<ArraySource>(std::move(cols)), std::move(owners)};
  }, py::arg("columns"), py::arg("owners"));
  // A mixture of native sources of one schema (ids laid end to end); keeps every child's objects.
  m.def("MixSource", [](const std::vector<SourceHandle>& children) {
    std::vector<std::shared_ptr<BatchSource>> sources;
    py::tuple keep(children.size());
    for (size_t j = 0; j < children.size(); ++j) {
      sources.push_back(children[j].source);
      keep[j] = children[j].keepalive;
    }
    return SourceHandle{std::make_shared<MixSource>(std::move(sources)), std::move(keep)};
  }, py::arg("children"));
  m.def("ragged_lengths_name", &ragged_lengths_name, py::arg("column"));
  m.attr("RESERVED_NAMES") = py::make_tuple(kIndexPartName, kValidPartName);
  m.attr("SOURCE_PART_NAME") = kSourcePartName;

  py::class_<BatchLayout, std::shared_ptr<BatchLayout>>(m, "BatchLayout",
                                                        "The parts of a batch: names, types, shapes and sizes.")
      .def(py::init([](const SourceHandle& s, int64_t max_rows, bool with_index, bool with_valid, bool with_source) {
             return std::make_shared<BatchLayout>(s.source->schema(), with_index, with_valid, max_rows, with_source);
           }),
           py::arg("source"), py::arg("max_rows"), py::arg("with_index"), py::arg("with_valid"),
           py::arg("with_source") = false)
      .def_property_readonly("names", &BatchLayout::names)
      .def_property_readonly("parts", [](const BatchLayout& L) { return schema_list(L.parts); })
      .def_property_readonly("part_row_bytes", [](const BatchLayout& L) { return L.part_row_bytes; })
      .def_readonly("max_rows", &BatchLayout::max_rows)
      .def("batch_bytes", &BatchLayout::batch_bytes, py::arg("rows"),
           "bytes of a batch of `rows` rows over every part");
}

}  // namespace fastload

// Tar shards as a batch source; see tar_source.h.
#include "image/tar_source.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "core/arrow_gather.h"
#include "core/npy_header.h"
#include "image/image_error.h"
#include "image/image_source.h"
#include "image/sample_rng.h"

namespace fastload::image {

namespace {

// Decimal text as webdataset writes class labels ("7", "7\n", " -3 "). False if it is not one.
bool parse_decimal(const uint8_t* p, int64_t n, int64_t* out) {
  int64_t i = 0;
  auto space = [](uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (i < n && space(p[i])) ++i;
  bool negative = false;
  if (i < n && (p[i] == '-' || p[i] == '+')) negative = p[i++] == '-';
  const int64_t first = i;
  uint64_t v = 0;
  for (; i < n && p[i] >= '0' && p[i] <= '9'; ++i) {
    v = v * 10 + static_cast<uint64_t>(p[i] - '0');
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
  }
  if (i == first) return false;
  while (i < n && space(p[i])) ++i;
  if (i != n) return false;
  *out = negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

std::string preview(const uint8_t* p, int64_t n) {
  std::string s(reinterpret_cast<const char*>(p), static_cast<size_t>(std::min<int64_t>(n, 40)));
  return n > 40 ? s + "..." : s;
}

}  // namespace

TarSource::TarSource(TarSampleTable table, std::shared_ptr<LazyFiles> files, std::vector<TarField> fields,
                     std::shared_ptr<const FallbackDecoder> fallback)
    : table_(std::move(table)), files_(std::move(files)), fields_(std::move(fields)), fallback_(std::move(fallback)) {
  const size_t shards = table_.shards.size();
  if (!files_) throw std::invalid_argument("tar samples: no files");
  if (table_.shard_starts.size() != shards + 1 || table_.shard_sizes.size() != shards ||
      table_.shard_files.size() != shards || table_.shard_starts.front() != 0)
    throw std::invalid_argument("tar samples: shard starts, sizes and files do not match the shards");
  for (size_t s = 0; s < shards; ++s) {
    const int32_t f = table_.shard_files[s];
    if (f < 0 || static_cast<size_t>(f) >= files_->size() || files_->file(f).bytes < table_.shard_sizes[s])
      throw std::invalid_argument("tar samples: shard " + std::to_string(s) + " has no file of its size");
  }
  for (size_t s = 0; s < shards; ++s)
    if (table_.shard_starts[s] > table_.shard_starts[s + 1])
      throw std::invalid_argument("tar samples: shard starts out of order");
  if (table_.samples() > 0 && (!table_.key_offsets || (table_.columns > 0 && (!table_.offsets || !table_.sizes))))
    throw std::invalid_argument("tar samples: missing arrays");
  for (const TarField& f : fields_) {
    if (f.kind != TarFieldKind::kKey && (f.column < 0 || f.column >= table_.columns))
      throw std::invalid_argument("tar field '" + f.name + "': column " + std::to_string(f.column) + " out of range");
    if (f.is_list()) {
      part_of_.push_back(lists_++);
      continue;
    }
    part_of_.push_back(schema_.size());
    if (f.kind == TarFieldKind::kInt) {
      schema_.push_back(PartSchema{f.name, kInt64, {}, sizeof(int64_t)});
    } else if (f.kind == TarFieldKind::kImage) {
      f.spec.check();
      schema_.push_back(image_part(f.name, f.spec));
    } else {  // kNpy
      int64_t elements = 1;
      for (int64_t d : f.npy_shape) {
        if (d < 0) throw std::invalid_argument("tar field '" + f.name + "': a negative dimension");
        elements *= d;
      }
      schema_.push_back(PartSchema{f.name, f.dtype, f.npy_shape, static_cast<size_t>(elements) * f.dtype.bits / 8});
    }
  }
}

std::string TarSource::where(int64_t id, size_t shard) const {
  const auto i = static_cast<size_t>(id);
  const std::string key(table_.keys + table_.key_offsets[i], static_cast<size_t>(table_.key_offsets[i + 1] - table_.key_offsets[i]));
  return "key '" + key + "' of tar shard '" + table_.shards[shard] + "'";
}

void TarSource::fill_part(const TarField& f, int64_t id, size_t shard, const uint8_t* member, int64_t size,
                          std::byte* dst, size_t row_bytes, const FillRequest& r) const {
  if (f.kind == TarFieldKind::kInt) {
    int64_t v = 0;
    if (!parse_decimal(member, size, &v))
      throw std::invalid_argument("field '" + f.name + "' of " + where(id, shard) + " is not a decimal integer: '" +
                                  preview(member, size) + "'");
    std::memcpy(dst, &v, sizeof v);
  } else if (f.kind == TarFieldKind::kNpy) {
    NpyHeader h;
    std::string why;
    if (!parse_npy_header(member, static_cast<size_t>(size), &h, &why))
      throw std::invalid_argument("field '" + f.name + "' of " + where(id, shard) + ": " + why);
    if (h.descr != f.npy_descr || h.shape != f.npy_shape)
      throw std::invalid_argument("field '" + f.name + "' of " + where(id, shard) + " is an array of " + h.descr + " " +
                                  npy_shape_text(h.shape) + ", the first sample's is " + f.npy_descr + " " +
                                  npy_shape_text(f.npy_shape) + ": a batch needs one shape and type per field");
    const size_t bytes = row_bytes;
    if (h.fortran_order && h.shape.size() > 1)
      throw std::invalid_argument("field '" + f.name + "' of " + where(id, shard) + " is in Fortran order; write it "
                                  "C-contiguous (np.ascontiguousarray)");
    if (h.data_offset + bytes > static_cast<size_t>(size))
      throw std::invalid_argument("field '" + f.name + "' of " + where(id, shard) + ": the .npy data is cut short");
    std::memcpy(dst, member + h.data_offset, bytes);
  } else {  // kImage
    try {
      SampleRng rng(r.seed, r.epoch, id);
      thread_decoder().decode(member, static_cast<size_t>(size), f.spec, rng, fallback_.get(),
                              reinterpret_cast<uint8_t*>(dst));
    } catch (const ImageError& e) {
      throw ImageError("field '" + f.name + "' of " + where(id, shard) + " (sample " + std::to_string(id) + "): " +
                       e.what());
    }
  }
}

void TarSource::fill(const FillRequest& r) {
  std::shared_ptr<ArrowStringLists> lists;
  if (lists_ > 0) {
    lists = std::make_shared<ArrowStringLists>();
    for (const TarField& f : fields_) {
      if (!f.is_list()) continue;
      lists->names.push_back(f.name);
      lists->utf8.push_back(f.kind != TarFieldKind::kBytes);
      lists->json.push_back(f.kind == TarFieldKind::kJson);
      lists->bytes.emplace_back();
      lists->offsets.emplace_back(1, 0);
      lists->valid.emplace_back();
    }
    if (r.extras) *r.extras = lists;
  }
  const int64_t n = table_.samples();
  // The shard of consecutive samples stays pinned (mapped, not evicted) while they are read; the
  // samples read from it are counted when it is unpinned (the fetcher of remote shards evicts a
  // shard only after the plan's reads of it are done).
  PinnedFiles pinned(*files_);
  int32_t pinned_file = -1, read_from_it = 0;
  const std::byte* base = nullptr;
  for (int64_t i = 0; i < r.count; ++i) {
    const int64_t id = r.ids[i];
    if (id < 0 || id >= n)
      throw std::out_of_range("sample id " + std::to_string(id) + " out of range [0, " + std::to_string(n) + ")");
    const auto shard = static_cast<size_t>(
        std::upper_bound(table_.shard_starts.begin(), table_.shard_starts.end(), id) - table_.shard_starts.begin() - 1);
    bool counted = false;
    for (size_t k = 0; k < fields_.size(); ++k) {
      const TarField& f = fields_[k];
      const uint8_t* member = nullptr;
      int64_t size = 0;
      if (f.kind == TarFieldKind::kKey) {
        const auto at = static_cast<size_t>(id);
        member = reinterpret_cast<const uint8_t*>(table_.keys + table_.key_offsets[at]);
        size = table_.key_offsets[at + 1] - table_.key_offsets[at];
      } else {
        const auto cell = static_cast<size_t>(id * table_.columns + f.column);
        const int64_t offset = table_.offsets[cell];
        size = table_.sizes[cell];
        if (offset < 0)
          throw std::invalid_argument(where(id, shard) + " has no field '" + f.name + "'");
        if (offset + size > table_.shard_sizes[shard])
          throw std::invalid_argument("field '" + f.name + "' of " + where(id, shard) + " runs past the shard's end");
        if (pinned_file != table_.shard_files[shard]) {
          pinned.release();
          pinned_file = table_.shard_files[shard];
          read_from_it = 0;
          pinned.pin(&pinned_file, 1, &base, &read_from_it);
        }
        if (!counted) ++read_from_it, counted = true;
        member = reinterpret_cast<const uint8_t*>(base) + offset;
      }
      if (f.is_list()) {
        const size_t l = part_of_[k];
        std::vector<char>& bytes = lists->bytes[l];
        bytes.insert(bytes.end(), reinterpret_cast<const char*>(member), reinterpret_cast<const char*>(member) + size);
        lists->offsets[l].push_back(static_cast<int64_t>(bytes.size()));
        lists->valid[l].push_back(1);
        continue;
      }
      const PartSchema& part = schema_[part_of_[k]];
      fill_part(f, id, shard, member, size, r.parts[part_of_[k]] + static_cast<size_t>(i) * part.row_bytes,
                part.row_bytes, r);
    }
  }
}

}  // namespace fastload::image

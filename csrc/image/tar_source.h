// Tar shards as a batch source (fl.Tar's native side): sample i is a group of members of one
// shard (tar_index.h), read as ranges of the shard, mapped on demand by the collation
// threads (lazy_mappings.h: the mapping budget, identity checks, fetches from object storage).
// Fields become int64 parts (class labels as decimal text), fixed-shape .npy parts, decoded
// images (image_decoder.h), or lists of str / parsed JSON / bytes carried with the batch
// (ArrowStringLists, turned into Python lists by the bindings). No Python per member or sample.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/batch_source.h"
#include "core/lazy_mappings.h"
#include "image/image_decoder.h"
#include "image/image_spec.h"

namespace fastload::image {

enum class TarFieldKind { kInt, kNpy, kImage, kText, kJson, kBytes, kKey };

// One field of the batch: what it is read as, and from which column of the sample table.
struct TarField {
  std::string name;
  TarFieldKind kind = TarFieldKind::kBytes;
  int64_t column = -1;              // -1 for kKey
  std::string npy_descr;            // kNpy: every sample's dtype (numpy's dtype.str) ...
  std::vector<int64_t> npy_shape;   // ... and shape (the first sample's)
  DType dtype;                      // kNpy: the element type of the part
  ImageSpec spec;                   // kImage
  bool is_list() const { return kind == TarFieldKind::kText || kind == TarFieldKind::kJson ||
                                kind == TarFieldKind::kBytes || kind == TarFieldKind::kKey; }
};

// Every shard's samples, as arrays Python owns (the handle keeps them alive): sample i of the
// dataset is in shard s where shard_starts[s] <= i < shard_starts[s + 1]; its field in column c
// is bytes [offsets[i * columns + c], + sizes[...]) of that shard (offset -1: missing); its key
// is keys[key_offsets[i], key_offsets[i + 1]). Shard s is file shard_files[s] of the LazyFiles.
struct TarSampleTable {
  std::vector<std::string> shards;      // names for errors (paths or URLs)
  std::vector<int64_t> shard_sizes;     // bytes, as indexed
  std::vector<int32_t> shard_files;     // the shard's file in the LazyFiles
  std::vector<int64_t> shard_starts;    // shards + 1
  const int64_t* offsets = nullptr;
  const int64_t* sizes = nullptr;
  int64_t columns = 0;
  const char* keys = nullptr;
  const int64_t* key_offsets = nullptr;
  int64_t samples() const { return shard_starts.empty() ? 0 : shard_starts.back(); }
};

class TarSource final : public BatchSource {
 public:
  // `files`: the shards, mapped on demand under the process's mapping budget, each checked
  // against the identity it had when indexed (a rewritten shard is refused, never read with a
  // stale index); fetched first when they are objects in storage (LazyFiles' provider). Throws
  // std::invalid_argument for an inconsistent table or a bad field.
  TarSource(TarSampleTable table, std::shared_ptr<LazyFiles> files, std::vector<TarField> fields,
            std::shared_ptr<const FallbackDecoder> fallback);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return table_.samples(); }
  bool has_string_lists() const override { return lists_ > 0; }
  void fill(const FillRequest& request) override;

 private:
  std::string where(int64_t id, size_t shard) const;  // "key 'k' of tar shard 'path'"
  void fill_part(const TarField& f, int64_t id, size_t shard, const uint8_t* member, int64_t size, std::byte* dst,
                 size_t row_bytes, const FillRequest& r) const;

  TarSampleTable table_;
  std::shared_ptr<LazyFiles> files_;
  std::vector<TarField> fields_;
  std::shared_ptr<const FallbackDecoder> fallback_;
  std::vector<PartSchema> schema_;
  std::vector<size_t> part_of_;  // per field: its part (fields read as lists: its list)
  size_t lists_ = 0;
};

}  // namespace fastload::image

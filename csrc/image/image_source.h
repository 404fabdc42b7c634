// Image files as a batch source (fl.ImageFolder's native side): sample i is file i, decoded by
// the collation threads into the batch's "image" part (image_decoder.h), with its int64 label
// in "label". No Python per image; a fallback decoder, when one is used, takes the GIL itself.
// Local files are read whole; files of object storage come through a LazyFiles (file i mapped
// on demand after its provider, the source's fetcher, made it present in the cache).
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

// Paths back to back: file i is bytes [offsets[i], offsets[i + 1]) of `bytes`.
struct PathList {
  std::string bytes;
  std::vector<int64_t> offsets;
  int64_t size() const { return offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1; }
  std::string at(int64_t i) const;
};

// Reads a whole file into `out`. Throws ImageError naming the file and the system's message.
void read_file(const std::string& path, std::vector<uint8_t>& out);

class ImageFileSource final : public BatchSource {
 public:
  // `labels`: one per file, or empty (no "label" part). `lazy` (may be null): file i is file i of
  // it, mapped (and fetched) on demand; `files` then names the files in errors (their URLs).
  // Throws std::invalid_argument for a bad spec, labels of another length or a `lazy` of
  // another length.
  ImageFileSource(PathList files, std::vector<int64_t> labels, ImageSpec spec,
                  std::shared_ptr<const FallbackDecoder> fallback, std::string image_name = "image",
                  std::string label_name = "label", std::shared_ptr<LazyFiles> lazy = nullptr);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return files_.size(); }
  void fill(const FillRequest& request) override;
  bool wants_source_epochs() const override { return true; }

 private:
  PathList files_;
  std::shared_ptr<LazyFiles> lazy_;
  std::vector<int64_t> labels_;
  ImageSpec spec_;
  std::shared_ptr<const FallbackDecoder> fallback_;
  std::vector<PartSchema> schema_;
};

// The batch part an image column fills: uint8, (H, W, 3) or (3, H, W).
PartSchema image_part(const std::string& name, const ImageSpec& spec);

// The decoder of the calling thread (a collation thread's, reused across batches and sources).
ImageDecoder& thread_decoder();

}  // namespace fastload::image

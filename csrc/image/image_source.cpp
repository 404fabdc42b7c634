// Image files as a batch source; see image_source.h.
#include "image/image_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "image/sample_rng.h"

namespace fastload::image {

std::string PathList::at(int64_t i) const {
  const auto k = static_cast<size_t>(i);
  return bytes.substr(static_cast<size_t>(offsets[k]), static_cast<size_t>(offsets[k + 1] - offsets[k]));
}

void read_file(const std::string& path, std::vector<uint8_t>& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ImageError("cannot open: " + std::string(std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw ImageError("cannot stat: " + std::string(std::strerror(e)));
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw ImageError("cannot read: " + std::string(std::strerror(e)));
    }
    if (n == 0) break;  // shrank while read: what is there is decoded (and likely refused)
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  ::close(fd);
}

PartSchema image_part(const std::string& name, const ImageSpec& spec) {
  PartSchema p;
  p.name = name;
  p.dtype = DType{kUInt, 8};
  p.row_shape = spec.layout == Layout::kHWC ? std::vector<int64_t>{spec.height, spec.width, 3}
                                            : std::vector<int64_t>{3, spec.height, spec.width};
  p.row_bytes = static_cast<size_t>(spec.out_bytes());
  return p;
}

ImageDecoder& thread_decoder() {
  thread_local ImageDecoder decoder;
  return decoder;
}

ImageFileSource::ImageFileSource(PathList files, std::vector<int64_t> labels, ImageSpec spec,
                                 std::shared_ptr<const FallbackDecoder> fallback, std::string image_name,
                                 std::string label_name, std::shared_ptr<LazyFiles> lazy)
    : files_(std::move(files)),
      lazy_(std::move(lazy)),
      labels_(std::move(labels)),
      spec_(spec),
      fallback_(std::move(fallback)) {
  spec_.check();
  const int64_t n = files_.size();
  for (int64_t i = 0; i < n; ++i)
    if (files_.offsets[static_cast<size_t>(i)] > files_.offsets[static_cast<size_t>(i) + 1] ||
        files_.offsets[static_cast<size_t>(i) + 1] > static_cast<int64_t>(files_.bytes.size()))
      throw std::invalid_argument("image paths: offsets out of order at file " + std::to_string(i));
  if (!labels_.empty() && static_cast<int64_t>(labels_.size()) != n)
    throw std::invalid_argument("image files: " + std::to_string(labels_.size()) + " labels for " +
                                std::to_string(n) + " files");
  if (lazy_ && static_cast<int64_t>(lazy_->size()) != n)
    throw std::invalid_argument("image files: " + std::to_string(lazy_->size()) + " mapped files for " +
                                std::to_string(n) + " names");
  schema_.push_back(image_part(image_name, spec_));
  if (!labels_.empty()) schema_.push_back(PartSchema{label_name, kInt64, {}, sizeof(int64_t)});
}

void ImageFileSource::fill(const FillRequest& r) {
  thread_local std::vector<uint8_t> bytes;
  ImageDecoder& decoder = thread_decoder();
  const size_t out_bytes = schema_[0].row_bytes;
  for (int64_t i = 0; i < r.count; ++i) {
    const int64_t id = r.ids[i];
    if (id < 0 || id >= files_.size())
      throw std::out_of_range("sample id " + std::to_string(id) + " out of range [0, " +
                              std::to_string(files_.size()) + ")");
    SampleRng rng(r.seed, r.source_epochs ? r.source_epochs[i] : r.epoch, id);
    uint8_t* out = reinterpret_cast<uint8_t*>(r.parts[0]) + static_cast<size_t>(i) * out_bytes;
    try {
      if (!lazy_) {
        read_file(files_.at(id), bytes);
        decoder.decode(bytes.data(), bytes.size(), spec_, rng, fallback_.get(), out);
        continue;
      }
      // One file pinned at a time (the fetcher's pin bound holds), counted as one read when
      // released: the fetcher then knows this sample's read of it is done. A provider's error
      // (an object deleted: FileNotFoundError naming its URL) passes through as it is.
      const int32_t file = static_cast<int32_t>(id);
      const int32_t one = 1;
      const std::byte* data = nullptr;
      PinnedFiles pinned(*lazy_);
      pinned.pin(&file, 1, &data, &one);
      decoder.decode(reinterpret_cast<const uint8_t*>(data), static_cast<size_t>(lazy_->file(file).bytes), spec_, rng,
                     fallback_.get(), out);
    } catch (const ImageError& e) {
      throw ImageError("image file '" + files_.at(id) + "' (sample " + std::to_string(id) + "): " + e.what());
    }
  }
  if (!labels_.empty()) {
    auto* out = reinterpret_cast<int64_t*>(r.parts[1]);
    for (int64_t i = 0; i < r.count; ++i) out[i] = labels_[static_cast<size_t>(r.ids[i])];
  }
}

}  // namespace fastload::image

// Tests of the decode stage (csrc/image): images decoded by the collation threads of an engine
// give the same bytes for every thread count, a bad file fails its batch with the file's name,
// every prefix of a JPEG and a PNG is decoded or refused (never a crash), and crops of every kind
// stay inside the decoded memory (the resize reads whole vectors). Built and run under
// ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh, with libjpeg and
// libpng (the script skips this binary where their headers are missing).
#include <png.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>

extern "C" {
#include <jpeglib.h>
}

#include "core_fixtures.h"
#include "image/image_decoder.h"
#include "image/image_source.h"

using namespace fastload::image;

namespace {

// A picture whose pixels are a function of (x, y, seed), with edges and texture.
std::vector<uint8_t> picture(int width, int height, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[(static_cast<size_t>(y) * width + x) * 3 + c] =
            static_cast<uint8_t>((x * (3 + c) + y * (5 + seed) + ((x / 7 + y / 5 + seed) % 3) * 60) & 255);
  return rgb;
}

std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& rgb, int width, int height, bool progressive) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = static_cast<JDIMENSION>(width);
  c.image_height = static_cast<JDIMENSION>(height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  if (progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb.data()) + static_cast<size_t>(c.next_scanline) * width * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> bytes(out, out + size);
  jpeg_destroy_compress(&c);
  std::free(out);
  return bytes;
}

std::vector<uint8_t> encode_png(const std::vector<uint8_t>& rgb, int width, int height) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&image, nullptr, &size, 0, rgb.data(), 0, nullptr);
  std::vector<uint8_t> bytes(size);
  png_image_write_to_memory(&image, bytes.data(), &size, 0, rgb.data(), 0, nullptr);
  bytes.resize(size);
  return bytes;
}

// A folder of images under /tmp, removed with the object.
struct Files {
  std::string dir;
  std::vector<std::string> paths;
  Files() {
    char tmpl[] = "/tmp/fastload_images_XXXXXX";
    dir = mkdtemp(tmpl);
  }
  ~Files() {
    for (const auto& p : paths) std::remove(p.c_str());
    rmdir(dir.c_str());
  }
  void add(const std::vector<uint8_t>& bytes, const char* ext) {
    paths.push_back(dir + "/" + std::to_string(paths.size()) + ext);
    std::ofstream(paths.back(), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                       static_cast<std::streamsize>(bytes.size()));
  }
  PathList list() const {
    PathList l;
    l.offsets.push_back(0);
    for (const auto& p : paths) {
      l.bytes += p;
      l.offsets.push_back(static_cast<int64_t>(l.bytes.size()));
    }
    return l;
  }
};

// 24 images: JPEG (baseline, progressive) and PNG, small and large, one smaller than the output.
void fill_folder(Files& f) {
  const int sizes[][2] = {{120, 90}, {64, 200}, {300, 220}, {20, 16}, {500, 375}, {97, 131}};
  for (int k = 0; k < 24; ++k) {
    const int w = sizes[k % 6][0], h = sizes[k % 6][1];
    const auto rgb = picture(w, h, k);
    if (k % 3 == 2) f.add(encode_png(rgb, w, h), ".png");
    else f.add(encode_jpeg(rgb, w, h, k % 3 == 1), ".jpg");
  }
}

ImageSpec spec_of(CropMode crop, int h, int w, double flip, Layout layout) {
  ImageSpec s;
  s.crop = crop;
  s.height = h;
  s.width = w;
  s.flip = flip;
  s.layout = layout;
  s.resize = std::max(h, w) + 8;
  return s;
}

// Every image of every batch of one epoch, by sample id.
std::map<int64_t, std::vector<uint8_t>> run_epoch(const std::shared_ptr<ImageFileSource>& source, int threads,
                                                  int64_t epoch, std::string* error) {
  EngineOptions o = engine_options(threads, 3, 5, false);
  Engine e(source, o);
  const SamplerConfig c = make_cfg(source->size(), 5, 1, 0, true, Order::Random, Even::Pad, false, 17);
  auto p = e.start(make_plans(c, {0}, epoch));
  std::map<int64_t, std::vector<uint8_t>> images;
  const size_t row = source->schema()[0].row_bytes;
  try {
    for (;;) {
      Batch b;
      const NextStatus s = next_blocking(*p, 0, &b);
      if (s != NextStatus::Ok) break;
      hand_out(b);
      const auto* ids = reinterpret_cast<const int64_t*>(b.parts[static_cast<size_t>(e.layout().index_part)]->data());
      const auto* labels = reinterpret_cast<const int64_t*>(b.parts[1]->data());
      for (int64_t i = 0; i < b.rows; ++i) {
        CHECK(labels[i] == ids[i] * 10);
        const auto* img = reinterpret_cast<const uint8_t*>(b.parts[0]->data()) + static_cast<size_t>(i) * row;
        images[ids[i]] = std::vector<uint8_t>(img, img + row);
      }
    }
  } catch (const CollationError& ex) {
    if (error) *error = ex.what();
  }
  return images;
}

std::shared_ptr<ImageFileSource> source_over(const Files& f, const ImageSpec& spec) {
  std::vector<int64_t> labels;
  for (size_t i = 0; i < f.paths.size(); ++i) labels.push_back(static_cast<int64_t>(i) * 10);
  return std::make_shared<ImageFileSource>(f.list(), labels, spec, nullptr);
}

}  // namespace

TEST_CASE(images_same_bytes_for_every_thread_count) {
  Files f;
  fill_folder(f);
  for (const ImageSpec& spec : {spec_of(CropMode::kRandom, 48, 40, 0.5, Layout::kHWC),
                                spec_of(CropMode::kCenter, 32, 64, 0.0, Layout::kCHW),
                                spec_of(CropMode::kNone, 24, 24, 1.0, Layout::kHWC)}) {
    auto source = source_over(f, spec);
    for (int64_t epoch : {0, 3}) {
      const auto one = run_epoch(source, 1, epoch, nullptr);
      CHECK(one.size() == f.paths.size());
      for (int threads : {2, 4}) {
        const auto many = run_epoch(source, threads, epoch, nullptr);
        CHECK_MSG(many == one, "threads " << threads << " epoch " << epoch);
      }
    }
  }
}

TEST_CASE(images_a_bad_file_fails_its_batch_with_its_name) {
  Files f;
  fill_folder(f);
  const std::vector<uint8_t> good = encode_jpeg(picture(80, 60, 1), 80, 60, false);
  f.add(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<ptrdiff_t>(good.size() / 2)), ".jpg");
  f.add({'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'}, ".jpg");
  ImageSpec spec = spec_of(CropMode::kNone, 60, 80, 0.0, Layout::kHWC);  // the whole file is read
  auto source = source_over(f, spec);
  for (int threads : {1, 4}) {
    std::string error;
    run_epoch(source, threads, 0, &error);
    const bool named = error.find(f.paths[24]) != std::string::npos || error.find(f.paths[25]) != std::string::npos;
    CHECK_MSG(named, error);
    CHECK_MSG(error.find("Premature end of JPEG file") != std::string::npos ||
                  error.find("format unknown") != std::string::npos,
              error);
  }
}

TEST_CASE(images_every_prefix_is_decoded_or_refused) {
  const auto rgb = picture(40, 30, 3);
  ImageSpec spec = spec_of(CropMode::kRandom, 16, 16, 0.5, Layout::kHWC);
  std::vector<uint8_t> out(static_cast<size_t>(spec.out_bytes()));
  for (const auto& bytes : {encode_jpeg(rgb, 40, 30, false), encode_jpeg(rgb, 40, 30, true), encode_png(rgb, 40, 30)}) {
    ImageDecoder decoder;
    int refused = 0;
    for (size_t n = 0; n <= bytes.size(); ++n) {
      std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
      SampleRng rng(1, 0, static_cast<int64_t>(n));
      try {
        decoder.decode(prefix.data(), prefix.size(), spec, rng, nullptr, out.data());
      } catch (const ImageError&) {
        ++refused;
      }
    }
    CHECK(refused > static_cast<int>(bytes.size()) / 2);
    SampleRng rng(1, 0, 0);
    decoder.decode(bytes.data(), bytes.size(), spec, rng, nullptr, out.data());  // still works after errors
  }
}

TEST_CASE(images_crops_of_every_kind_from_threads_at_once) {
  std::vector<std::vector<uint8_t>> files;
  const int sizes[][2] = {{1, 1}, {3, 200}, {200, 3}, {257, 255}, {640, 480}, {33, 17}};
  for (int k = 0; k < 6; ++k) {
    const auto rgb = picture(sizes[k][0], sizes[k][1], k);
    files.push_back(encode_jpeg(rgb, sizes[k][0], sizes[k][1], k % 2 == 1));
    files.push_back(encode_png(rgb, sizes[k][0], sizes[k][1]));
  }
  std::vector<ImageSpec> specs;
  for (CropMode crop : {CropMode::kRandom, CropMode::kCenter, CropMode::kNone})
    for (int size : {1, 7, 64, 150})
      for (Layout layout : {Layout::kHWC, Layout::kCHW}) specs.push_back(spec_of(crop, size, size + 3, 0.5, layout));
  std::atomic<int64_t> decoded{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      ImageDecoder& decoder = thread_decoder();
      for (size_t s = static_cast<size_t>(t); s < specs.size(); s += 2) {
        std::vector<uint8_t> out(static_cast<size_t>(specs[s].out_bytes()));
        for (size_t k = 0; k < files.size(); ++k)
          for (int64_t i = 0; i < 3; ++i) {
            SampleRng rng(5, t, i * 100 + static_cast<int64_t>(k));
            decoder.decode(files[k].data(), files[k].size(), specs[s], rng, nullptr, out.data());
            ++decoded;
          }
      }
    });
  for (auto& th : threads) th.join();
  int64_t expected = 0;  // thread t decodes specs t, t + 2, ...: every file, three crops each
  for (size_t t = 0; t < 4; ++t) expected += static_cast<int64_t>((specs.size() - t + 1) / 2 * files.size() * 3);
  CHECK_MSG(decoded.load() == expected, decoded.load() << " of " << expected);
}

TEST_CASE(images_formats_without_a_decoder_are_refused) {
  ImageDecoder decoder;
  ImageSpec spec = spec_of(CropMode::kRandom, 8, 8, 0, Layout::kHWC);
  std::vector<uint8_t> out(static_cast<size_t>(spec.out_bytes()));
  const uint8_t webp[] = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', ' '};
  SampleRng rng(0, 0, 0);
  CHECK_THROWS(decoder.decode(webp, sizeof(webp), spec, rng, nullptr, out.data()), ImageError, "format WebP");
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_images"); }

// The decode ceiling of bench/bench_images.py: libjpeg-turbo decoding exactly the regions fastload
// decodes (the same crops at the same DCT scale, read from a plan file), on N threads, with no
// resize, no flip and no batch: what the machine can do for the decode alone.
//   g++ -O2 bench/images_ceiling.cpp -ljpeg -lpthread -o images_ceiling
//   images_ceiling PLAN THREADS ROUNDS    # PLAN lines: path eighths x y width height
// Prints one line per round: "images seconds cpu_seconds" (the process's CPU time in the round).
#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <jpeglib.h>
}

struct Item {
  std::string path;
  int eighths, x, y, width, height;
};

static void decode(const Item& it, std::vector<unsigned char>& bytes, std::vector<unsigned char>& pixels,
                   jpeg_decompress_struct& c) {
  std::ifstream f(it.path, std::ios::binary | std::ios::ate);
  bytes.resize(static_cast<size_t>(f.tellg()));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  jpeg_mem_src(&c, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&c, TRUE);
  c.scale_num = static_cast<unsigned>(it.eighths);
  c.scale_denom = 8;
  c.out_color_space = JCS_EXT_RGBX;
  jpeg_start_decompress(&c);
  JDIMENSION xoff = static_cast<JDIMENSION>(it.x), w = static_cast<JDIMENSION>(it.width);
  if (xoff > 0 || w < c.output_width) jpeg_crop_scanline(&c, &xoff, &w);
  if (it.y > 0) jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(it.y));
  pixels.resize(static_cast<size_t>(w) * 4 * static_cast<size_t>(it.height));
  for (int r = 0; r < it.height;) {
    JSAMPROW row = pixels.data() + static_cast<size_t>(r) * w * 4;
    r += static_cast<int>(jpeg_read_scanlines(&c, &row, 1));
  }
  jpeg_abort_decompress(&c);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: images_ceiling PLAN THREADS ROUNDS\n");
    return 2;
  }
  std::vector<Item> items;
  std::ifstream plan(argv[1]);
  for (std::string line; std::getline(plan, line);) {
    std::istringstream is(line);
    Item it;
    if (is >> it.path >> it.eighths >> it.x >> it.y >> it.width >> it.height) items.push_back(it);
  }
  const int threads = std::atoi(argv[2]), rounds = std::atoi(argv[3]);
  for (int round = 0; round < rounds; ++round) {
    std::atomic<size_t> next{0};
    timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        jpeg_decompress_struct c;
        jpeg_error_mgr err;
        c.err = jpeg_std_error(&err);
        jpeg_create_decompress(&c);
        std::vector<unsigned char> bytes, pixels;
        for (size_t i; (i = next++) < items.size();) decode(items[i], bytes, pixels, c);
        jpeg_destroy_decompress(&c);
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    const double cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) + 1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec);
    std::printf("%zu %.6f %.6f\n", items.size(), s, cpu);
    std::fflush(stdout);
  }
  return 0;
}

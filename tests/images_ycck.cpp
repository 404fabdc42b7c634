// Writes a YCCK JPEG (Adobe marker, transform 2) from raw CMYK bytes: PIL cannot write one, and
// tests/test_images_formats.py needs one. Usage: images_ycck WIDTH HEIGHT < cmyk > out.jpg
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" {
#include <jpeglib.h>
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const int width = std::atoi(argv[1]), height = std::atoi(argv[2]);
  std::vector<unsigned char> cmyk(static_cast<size_t>(width) * height * 4);
  if (std::fread(cmyk.data(), 1, cmyk.size(), stdin) != cmyk.size()) return 3;
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, stdout);
  cinfo.image_width = width;
  cinfo.image_height = height;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_colorspace(&cinfo, JCS_YCCK);
  jpeg_set_quality(&cinfo, 92, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = cmyk.data() + static_cast<size_t>(cinfo.next_scanline) * width * 4;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return 0;
}

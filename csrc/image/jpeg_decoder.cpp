// libjpeg glue; see jpeg_decoder.h. libjpeg reports errors by calling error_exit, which must not
// return: here it longjmps back to the call that started the work (setjmp), where the message
// becomes an ImageError. Between a setjmp and its longjmp only libjpeg's C frames and plain
// values live, so nothing with a destructor is skipped. Warnings that mean the pixels are not
// the file's (truncated data, a bad Huffman code) are errors: libjpeg would fill the rest grey.
#include "image/jpeg_decoder.h"

#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <algorithm>
#include <cstring>

// jpeglib.h first: jerror.h numbers its messages by what jconfig.h (via jpeglib.h) defines.
extern "C" {
#include <jpeglib.h>
#include <jerror.h>
}

#include "image/image_error.h"

namespace fastload::image {

namespace {

#define FASTLOAD_STR2(x) #x
#define FASTLOAD_STR(x) FASTLOAD_STR2(x)

struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings that mean missing or made-up pixels.
bool corrupts_pixels(int code) {
  switch (code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
#if JPEG_LIB_VERSION >= 70 || defined(D_ARITH_CODING_SUPPORTED)
    case JWRN_ARITH_BAD_CODE:
#endif
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
      return true;
    default:  // extraneous bytes between markers, an unknown JFIF revision, a bad ICC marker...
      return false;
  }
}

void on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && corrupts_pixels(cinfo->err->msg_code)) on_error(cinfo);
}

void silent(j_common_ptr) {}

// PIL's CMYK -> RGB: each channel (255 - K) - C * (255 - K) / 255, rounded as PIL's MULDIV255;
// Adobe's JPEGs store the channels inverted (PIL reads them as "CMYK;I").
inline uint8_t cmyk_channel(int c, int nk) {
  const int t = c * nk + 128;
  const int v = nk - (((t >> 8) + t) >> 8);
  return static_cast<uint8_t>(v < 0 ? 0 : v);
}

void cmyk_to_rgbx(const uint8_t* in, uint8_t* out, int n, bool inverted) {
  for (int x = 0; x < n; ++x, in += 4, out += 4) {
    const int flip = inverted ? 255 : 0;
    const int nk = 255 - (in[3] ^ flip);
    out[0] = cmyk_channel(in[0] ^ flip, nk);
    out[1] = cmyk_channel(in[1] ^ flip, nk);
    out[2] = cmyk_channel(in[2] ^ flip, nk);
    out[3] = 255;
  }
}

}  // namespace

struct JpegDecoder::State {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  bool started = false;  // a header has been read (an image is in progress)
  bool cmyk = false;
  std::vector<uint8_t> cmyk_rows;
  std::vector<JSAMPROW> rows;
};

JpegDecoder::JpegDecoder() : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.cinfo.err = jpeg_std_error(&s.err.pub);
  s.err.pub.error_exit = on_error;
  s.err.pub.emit_message = on_message;
  s.err.pub.output_message = silent;
  if (setjmp(s.err.jump)) throw ImageError(std::string("libjpeg could not start: ") + s.err.message);
  jpeg_create_decompress(&s.cinfo);
}

JpegDecoder::~JpegDecoder() { jpeg_destroy_decompress(&state_->cinfo); }

void JpegDecoder::reset() {
  if (state_->started) jpeg_abort_decompress(&state_->cinfo);
  state_->started = false;
}

JpegHeader JpegDecoder::read_header(const uint8_t* data, size_t size) {
  reset();
  State& s = *state_;
  jpeg_decompress_struct* cinfo = &s.cinfo;
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(cinfo);
    s.started = false;
    throw ImageError(std::string("JPEG header: ") + s.err.message);
  }
  s.started = true;
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  JpegHeader h;
  h.width = static_cast<int>(cinfo->image_width);
  h.height = static_cast<int>(cinfo->image_height);
  h.components = cinfo->num_components;
  h.cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  s.cmyk = h.cmyk;
  return h;
}

void JpegDecoder::scaled_size(int eighths, int* width, int* height) const {
  const jpeg_decompress_struct& c = state_->cinfo;
  *width = static_cast<int>((static_cast<int64_t>(c.image_width) * eighths + 7) / 8);
  *height = static_cast<int>((static_cast<int64_t>(c.image_height) * eighths + 7) / 8);
}

PixelRegion JpegDecoder::decode(int eighths, int x0, int x1, int y0, int y1, std::vector<uint8_t>& buffer) {
  State& s = *state_;
  jpeg_decompress_struct* cinfo = &s.cinfo;
  if (!s.started) throw std::logic_error("JpegDecoder::decode before read_header");
  PixelRegion region;
  if (setjmp(s.err.jump)) {
    jpeg_abort_decompress(cinfo);
    s.started = false;
    throw ImageError(std::string("JPEG data: ") + s.err.message);
  }
  cinfo->scale_num = static_cast<unsigned>(eighths);
  cinfo->scale_denom = 8;
  cinfo->out_color_space = s.cmyk ? JCS_CMYK : JCS_EXT_RGBX;  // 4 bytes a pixel: whole vectors
  cinfo->dct_method = JDCT_ISLOW;  // PIL's and libjpeg's default: the exact integer IDCT
  jpeg_start_decompress(cinfo);
  // A cropped row's last pixels are upsampled from chroma without its right neighbour (libjpeg
  // treats the crop's edge as the image's): a few more columns keep the ones asked for exact.
  constexpr int kChromaContext = 4;
  const JDIMENSION full_width = cinfo->output_width;
  const JDIMENSION end = std::min<JDIMENSION>(full_width, static_cast<JDIMENSION>(x1 + kChromaContext));
  JDIMENSION xoffset = static_cast<JDIMENSION>(std::max(0, x0 - kChromaContext));
  JDIMENSION width = end - xoffset;
  if (xoffset > 0 || end < full_width) jpeg_crop_scanline(cinfo, &xoffset, &width);
  else xoffset = 0, width = full_width;
  if (y0 > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(y0));
  const int rows = y1 - y0;
  const size_t stride = static_cast<size_t>(width) * 4;
  buffer.resize(stride * static_cast<size_t>(rows) + kRegionSlack);
  s.rows.resize(static_cast<size_t>(cinfo->rec_outbuf_height));
  if (s.cmyk) s.cmyk_rows.resize(static_cast<size_t>(width) * 4 * s.rows.size());
  int done = 0;
  while (done < rows) {
    const int want = std::min<int>(rows - done, static_cast<int>(s.rows.size()));
    for (int k = 0; k < want; ++k)
      s.rows[static_cast<size_t>(k)] = s.cmyk ? s.cmyk_rows.data() + static_cast<size_t>(k) * width * 4
                                              : buffer.data() + static_cast<size_t>(done + k) * stride;
    const int got = static_cast<int>(jpeg_read_scanlines(cinfo, s.rows.data(), static_cast<JDIMENSION>(want)));
    if (got <= 0) {
      std::strcpy(s.err.message, "the decoder returned no rows");
      std::longjmp(s.err.jump, 1);
    }
    if (s.cmyk)
      for (int k = 0; k < got; ++k)
        cmyk_to_rgbx(s.cmyk_rows.data() + static_cast<size_t>(k) * width * 4,
                    buffer.data() + static_cast<size_t>(done + k) * stride, static_cast<int>(width),
                    cinfo->saw_Adobe_marker);
    done += got;
  }
  jpeg_abort_decompress(cinfo);  // the rows below the crop are never decoded
  s.started = false;
  region.data = buffer.data();
  region.stride = static_cast<ptrdiff_t>(stride);
  region.x0 = static_cast<int>(xoffset);
  region.y0 = y0;
  region.width = static_cast<int>(width);
  region.height = rows;
  return region;
}

std::string jpeg_library_version() {
#ifdef LIBJPEG_TURBO_VERSION
  return "libjpeg-turbo " FASTLOAD_STR(LIBJPEG_TURBO_VERSION);
#else
  return "libjpeg " + std::to_string(JPEG_LIB_VERSION);
#endif
}

}  // namespace fastload::image

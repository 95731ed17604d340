#include "worker/data/jpeg.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "common/error.h"

namespace tessera {
namespace {

// libjpeg reports errors through error_exit, which must not return: it longjmps back to the call.
struct ErrorManager {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {0};
  int warnings = 0;
  char first_warning[JMSG_LENGTH_MAX] = {0};
};

void on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (level -1: corrupt data, a premature end) make the decode fail afterwards; trace messages
// (levels above 0) are ignored.
void on_message(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (level >= 0) return;
  if (e->warnings++ == 0) (*cinfo->err->format_message)(cinfo, e->first_warning);
}

enum class Mode { kHeader, kCheck, kFull };

Image decode(const std::string& bytes, const std::string& name, Mode mode) {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_error;
  err.mgr.emit_message = on_message;
  // Every object with a destructor is made before setjmp: the jump back must not skip one.
  Image out;
  std::vector<uint8_t> rows;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw Error("'" + name + "': not a JPEG libjpeg can decode: " + err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    throw Error("'" + name + "': a CMYK JPEG; convert it to RGB (e.g. `convert FILE -colorspace sRGB FILE`)");
  }
  out.width = static_cast<int>(cinfo.image_width);
  out.height = static_cast<int>(cinfo.image_height);
  if (mode == Mode::kHeader) {
    jpeg_destroy_decompress(&cinfo);
    return out;
  }
  cinfo.out_color_space = JCS_RGB;
  if (mode == Mode::kCheck) {
    cinfo.scale_num = 1;
    cinfo.scale_denom = 8;
  }
  jpeg_start_decompress(&cinfo);
  const size_t row_bytes = static_cast<size_t>(cinfo.output_width) * 3;
  rows.resize(row_bytes * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = rows.data() + row_bytes * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (err.warnings > 0) throw Error("'" + name + "': damaged JPEG data: " + err.first_warning);
  if (mode == Mode::kFull) out.rgb = std::move(rows);
  return out;
}

}  // namespace

Image jpeg_size(const std::string& bytes, const std::string& name) { return decode(bytes, name, Mode::kHeader); }
Image jpeg_decode(const std::string& bytes, const std::string& name) { return decode(bytes, name, Mode::kFull); }
Image jpeg_check(const std::string& bytes, const std::string& name) { return decode(bytes, name, Mode::kCheck); }

std::string jpeg_encode(const Image& image, int quality) {
  TESSERA_CHECK(image.width > 0 && image.height > 0 &&
                    image.rgb.size() == static_cast<size_t>(image.width) * static_cast<size_t>(image.height) * 3,
                "an image of ", image.width, "x", image.height, " with ", image.rgb.size(), " bytes");
  jpeg_compress_struct cinfo;
  ErrorManager err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_error;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    throw Error(std::string("JPEG encoding failed: ") + err.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t row_bytes = static_cast<size_t>(image.width) * 3;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(image.rgb.data()) + row_bytes * cinfo.next_scanline;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<const char*>(buffer), size);
  std::free(buffer);
  return out;
}

}  // namespace tessera

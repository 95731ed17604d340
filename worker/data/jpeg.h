// JPEG files through Debian's libjpeg-turbo: their size from the header, their pixels as 8-bit RGB,
// and encoding (for generated image datasets). Decoding is strict: a file libjpeg cannot read, or one
// it reads only with warnings (a truncated file, corrupt entropy data), is an Error naming it, never
// a partly grey image. Thread-safe (every call has its own decompressor).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height x width x 3, row by row
};

// Width and height from the header. Error naming `name` when the bytes are not a JPEG libjpeg can
// decode to RGB (CMYK and YCCK files are refused).
Image jpeg_size(const std::string& bytes, const std::string& name);
// The whole image in RGB (greyscale files as three equal channels). Error naming `name` as above.
Image jpeg_decode(const std::string& bytes, const std::string& name);
// The image, decoded at 1/8 scale (libjpeg's DCT scaling): reads every byte of the entropy data, so
// it finds the same damage jpeg_decode would, without the full-size inverse DCT and colour
// conversion. Returns the full-size width and height (rgb empty). Error naming `name` as above.
Image jpeg_check(const std::string& bytes, const std::string& name);
// A baseline JPEG of an RGB image, at `quality` (1-100).
std::string jpeg_encode(const Image& image, int quality = 90);

}  // namespace tessera

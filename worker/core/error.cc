#include "worker/core/error.h"

namespace tessera::detail {

void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  throw std::logic_error(concat("check failed at ", file, ":", line, ": ", expr,
                                msg.empty() ? "" : " ", msg));
}

}  // namespace tessera::detail

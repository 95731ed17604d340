// LocalPrometheus: Debian's Prometheus for `tessera run --prometheus`, scraping the local
// controller and, through its /targets, the workers, every 2 s into <dir>/data; stopped (its data
// kept) when this object goes. The constructor returns once Prometheus is ready (at most 30 s).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/process.h"

namespace tessera::local {

class LocalPrometheus {
 public:
  // bin: the prometheus command; listen: its address; controller: host:port of /metrics and /targets.
  // say: where it tells what it did.
  LocalPrometheus(const std::string& dir, const std::string& bin, const std::string& listen,
                  const std::string& controller, std::function<void(const std::string&)> say);
  ~LocalPrometheus();

 private:
  std::string dir_, bin_;
  std::function<void(const std::string&)> say_;
  std::unique_ptr<Process> process_;
};

}  // namespace tessera::local

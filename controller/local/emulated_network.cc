#include "controller/local/emulated_network.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace tessera::local {

EmulatedNetwork::EmulatedNetwork(const std::string& netns_bin, int nodes, const std::string& rate,
                                 const std::string& delay, const std::string& field, bool quiet)
    : netns_bin_(netns_bin) {
  if (geteuid() != 0)
    throw ConfigError(field, "an emulated network needs root (network namespaces and tc); run as root or leave it out");
  for (const std::string* v : {&rate, &delay})
    if (v->find_first_not_of("0123456789.kmgbitpsu") != std::string::npos)
      throw ConfigError(field, "'" + *v + "' is not a tc rate or time");
  const std::string up = detail::concat(netns_bin_, " up --nodes ", nodes, " --rate ", rate,
                                        delay.empty() ? "" : " --delay " + delay, quiet ? " >&2" : "");
  std::fflush(stdout);
  if (std::system(up.c_str()) != 0) throw ConfigError(field, "the emulated network did not come up (" + up + ")");
}

EmulatedNetwork::~EmulatedNetwork() { [[maybe_unused]] const int rc = std::system((netns_bin_ + " down >&2").c_str()); }

std::string EmulatedNetwork::address(int node) { return detail::concat("10.77.0.", node + 1); }

}  // namespace tessera::local

// EmulatedNetwork: spec.local.network's emulated cloud network, up for the life of this object: one
// network namespace per virtual node (tessera-n0, tessera-n1, ...) on a bridge, each node's link
// limited to the rate (and delay) asked for. The tessera-netns program beside the binaries does the
// work (it needs root: ip netns, tc); `tessera run` and `tessera-bench cluster` both use it here.
#pragma once

#include <string>

namespace tessera::local {

class EmulatedNetwork {
 public:
  static constexpr const char* kBridge = "10.77.0.254";         // this machine's address on the nodes' bridge
  static constexpr const char* kNamespacePrefix = "tessera-n";  // + the node's index

  // Brings the network up (`netns_bin up`); throws ConfigError naming `field` when it cannot.
  // quiet: tessera-netns' own lines go to standard error, not standard output.
  EmulatedNetwork(const std::string& netns_bin, int nodes, const std::string& rate, const std::string& delay,
                  const std::string& field, bool quiet = false);
  ~EmulatedNetwork();  // takes it down: no namespace, veth or bridge is left
  EmulatedNetwork(const EmulatedNetwork&) = delete;
  EmulatedNetwork& operator=(const EmulatedNetwork&) = delete;

  // Node K's address on the bridge.
  static std::string address(int node);

 private:
  std::string netns_bin_;
};

}  // namespace tessera::local

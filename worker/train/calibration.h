// What a gang measures at its start for communication.strategy auto, in the cost model's terms
// (common/cost_model.h): the controller chooses the exchange from it (common/exchange_choice.h).
//
// - Links between nodes: the first rank of each node exchanges probes of two sizes with every other
//   node's (probe_node_links); the slowest pair gives the latency (alpha) and seconds per byte on
//   the wire, as a ring is as slow as its slowest link, and the process's CPU time over the larger
//   probe the CPU seconds per byte sent.
// - Inside a node: ranks 0 and 1 of the first node do the same through loopback (or the backend's
//   own path), which is CPU work.
// - Shared cores: when every rank runs on one machine (the same boot id), its cores are shared by
//   all of them, and CPU work of each runs slower by ranks / cores.
// - The sparse exchanges' CPU work, on rank 0 while the others wait: top-k selection at each
//   candidate density, a streaming pass and a scatter-add, per float (pair), on a bucket of the
//   job's largest size (at most 8M floats).
// - A step's compute (forward, backward, update) is the trainer's, from the gang's first steps.
#pragma once

#include <string>
#include <vector>

#include "common/exchange_choice.h"
#include "worker/comm/topology.h"

namespace tessera {

// The compute, the buckets and overlap are the trainer's to fill in.
using GangCalibration = cost::Calibration;

// Collective over the world: every rank calls it, and every rank gets the same figures.
// `bucket_floats`: the largest bucket; `densities`: the candidate densities; `selector`: mstopk or
// exact.
GangCalibration calibrate_gang(CommGroups& groups, size_t bucket_floats, const std::vector<double>& densities,
                               const std::string& selector);

}  // namespace tessera

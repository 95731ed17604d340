#include "bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include "controller/local/emulated_network.h"
#include "worker/data/dataset_index.h"
#include "worker/train/job_config.h"

namespace tessera::bench {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

nlohmann::json python_peer(const std::string& script_and_args) {
  const std::string cmd =
      detail::concat("/usr/bin/python3 ", TESSERA_SOURCE_DIR, "/bench/torch/", script_and_args, " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return nullptr;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  if (pclose(p) != 0 || out.empty()) return nullptr;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    return nullptr;
  }
}

std::string enter_node(int node) {
  const std::string path =
      "/var/run/netns/" + std::string(local::EmulatedNetwork::kNamespacePrefix) + std::to_string(node);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
    throw Error(detail::concat("cannot enter ", path, ": ", std::strerror(errno), " (is the emulated cluster up?)"));
  close(fd);
  return local::EmulatedNetwork::address(node);
}

Tensor random_tensor(const Shape& s, uint32_t seed) {
  Tensor t(s);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : t.span()) v = n(rng);
  return t;
}

JobConfig hdf5_job(const std::string& dir, int samples, int size, int batch, int threads) {
  set_default_log_level(LogLevel::kWarn);
  generate_dataset("cosmoflow", samples, size, dir + "/train", 1);
  generate_dataset("cosmoflow", batch, size, dir + "/val", 2);
  JobConfig job;
  job.model.input_size = size;
  job.data.format = "hdf5";
  job.data.path = dir + "/train";
  job.data.validation_path = dir + "/val";
  job.data.cache.ssd_dir = dir + "/ssd";
  job.training.batch_size = batch;
  job.training.threads = threads;
  job.training.log_every_seconds = 1e9;
  job.training.optimizer.name = "adam";
  job.training.schedule.base_lr = 1e-4;
  return job;
}

std::string netns_program() {
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / "tessera-netns").string();
}

}  // namespace tessera::bench

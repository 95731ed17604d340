// RendezvousService: the controller's gRPC service where a job's workers meet. Each job is added
// with its token and ring plan; workers register as (replica, slot) and get their rank from the
// plan (the same rank again after a restart), then use the job's key-value store (with waits) to
// bootstrap their communicators, and barriers. Requests with a wrong token are refused
// (PERMISSION_DENIED); unknown jobs are NOT_FOUND. Thread-safe; serves on its own threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "controller/placement/ring_planner.h"

namespace tessera {

class RendezvousService {
 public:
  // Listens on `address` ("127.0.0.1:0" picks a free port).
  explicit RendezvousService(const std::string& address = "127.0.0.1:0");
  ~RendezvousService();
  int port() const;
  std::string target() const;  // "127.0.0.1:<port>"

  // Adds (or replaces, for a restarted gang: store and barriers start empty) a job.
  void add_job(const std::string& job, const std::string& token, std::vector<placement::RankAssignment> plan);
  void remove_job(const std::string& job);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera

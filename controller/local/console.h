// JobConsole: what `tessera run` prints as a job runs: timestamped lines, the placement, a progress
// line (epoch, step, samples/s, loss, exchange phase, restarts) and the final report. Thread-compatible.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "api/training_job.h"
#include "controller/local/local_launcher.h"
#include "controller/reconcile/progress.h"

namespace tessera::local {

class JobConsole {
 public:
  JobConsole(std::FILE* out, const api::TrainingJob& job) : out_(out), job_(job) {}

  // One line, "[HH:MM:SS] line".
  void say(const std::string& line) const;
  // The gang's placement (`status` holds it), the first time in full, later in a line.
  void placed(const nlohmann::json& status, const std::string& where, const std::string& rendezvous, int threads,
              const std::string& logs);
  // The latest progress of a running job; nothing before the first step.
  void progress(const reconcile::Progress& p, const nlohmann::json& status) const;
  // How the job ended: its figures, restarts and validation.
  void report(const LocalResult& r) const;

 private:
  std::FILE* out_;
  const api::TrainingJob& job_;
  bool announced_ = false;
};

}  // namespace tessera::local

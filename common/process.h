// A child process: started with posix_spawn, its stdout and stderr appended to
// a log file, polled without blocking, stopped with SIGTERM and then SIGKILL.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

// Starts argv[0] (a path) with argv, the current environment plus `env` ("K=V"), stdout and stderr
// appended to `log`. Throws Error when it cannot be started.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log);

class Process {
 public:
  // spawn(argv, env, log).
  Process(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log)
      : pid_(spawn(argv, env, log)) {}
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();  // kills a process still running

  pid_t pid() const { return pid_; }
  // The exit status once it has ended: the exit code, or 128 + the signal that killed it.
  std::optional<int> poll();
  // Sends SIGTERM (when it is still running) without waiting.
  void terminate();
  // SIGTERM, then SIGKILL if it has not ended within `grace`; waits for it.
  int stop(std::chrono::milliseconds grace);

  // "exited with status 3" / "was killed by signal 9 (Killed)".
  static std::string describe(int status);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace tessera

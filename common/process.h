// A child process: started with posix_spawn (its stdout and stderr appended to a log file, or the
// parent's), polled without blocking, signalled, stopped with SIGTERM and then SIGKILL. A Process is
// used by one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct SpawnOptions {
  std::string program;                   // the file to run: a path, or a bare name looked up on PATH; empty: argv[0]
  std::vector<std::string> env;          // "K=V": added to the current environment, replacing a variable of that name
  std::string log;                       // stdout and stderr appended to this file; empty: the parent's
  std::vector<std::pair<int, int>> fds;  // (a descriptor of the parent, the number it has in the child)
};

// Starts `options.program` (else argv[0]) with argv. Throws Error when it cannot be started.
pid_t spawn(const std::vector<std::string>& argv, const SpawnOptions& options);
// argv[0] with argv, the current environment plus `env`, stdout and stderr appended to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log);

class Process {
 public:
  Process(const std::vector<std::string>& argv, const SpawnOptions& options) : pid_(spawn(argv, options)) {}
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
  // Sends `sig` when it is still running, without waiting.
  void signal(int sig);
  // SIGTERM, then SIGKILL if it has not ended within `grace`; waits for it.
  int stop(std::chrono::milliseconds grace);

  // "exited with status 3" / "was killed by signal 9 (Killed)".
  static std::string describe(int status);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

}  // namespace tessera

// Test support: start real processes (the local launcher's spawn), wait for them with a deadline, kill them.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"

namespace tessera::testing {

// Starts argv[0] with argv, stdout and stderr appended to `log`, extra environment entries "K=V".
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& log,
                   const std::vector<std::string>& env = {}) {
  return tessera::spawn(argv, env, log);
}

#ifndef TESSERA_TEST_SLOWDOWN
#define TESSERA_TEST_SLOWDOWN 1
#endif
// Deadlines of processes are stretched by this factor in sanitized builds.
inline constexpr int kSlowdown = TESSERA_TEST_SLOWDOWN;

// Exit code of pid, 128+signal if killed by a signal, or -1 (after SIGKILL) if still running at the
// deadline (timeout x kSlowdown).
inline int wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout * kSlowdown;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tessera::testing

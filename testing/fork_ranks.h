// Runs one function per rank in its own forked process (real processes: separate address spaces,
// real sockets, crashes and exits). Used by the multi-process tests and by tessera-bench.
// Call before the parent creates threads that the children would need.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace tessera::testing {

struct RankOutcome {
  int exit_code = -1;  // the child's exit status; 128+signal if killed; -1 if it was killed on timeout
  std::string report;  // what the child's function wrote into its report
};

// fn(rank, report) runs in the child; its return value is the exit code. Children still running at
// `timeout` are killed (exit_code -1).
inline std::vector<RankOutcome> fork_ranks(int world, const std::function<int(int, std::string&)>& fn,
                                           std::chrono::milliseconds timeout) {
  std::vector<pid_t> pids(world);
  std::vector<int> fds(world);
  for (int r = 0; r < world; ++r) {
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      std::string report;
      int code = 1;
      try {
        code = fn(r, report);
      } catch (const std::exception& e) {
        report += std::string("exception: ") + e.what();
        code = 2;
      }
      size_t off = 0;
      while (off < report.size()) {
        ssize_t n = write(p[1], report.data() + off, report.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      close(p[1]);
      _exit(code);
    }
    close(p[1]);
    pids[r] = pid;
    fds[r] = p[0];
  }
  std::vector<RankOutcome> out(world);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int open_fds = world;
  std::vector<bool> closed(world, false);
  while (open_fds > 0 && std::chrono::steady_clock::now() < deadline) {
    std::vector<pollfd> pf;
    std::vector<int> who;
    for (int r = 0; r < world; ++r)
      if (!closed[r]) {
        pf.push_back({fds[r], POLLIN, 0});
        who.push_back(r);
      }
    if (poll(pf.data(), pf.size(), 50) <= 0) continue;
    for (size_t i = 0; i < pf.size(); ++i) {
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = read(pf[i].fd, buf, sizeof(buf));
      if (n > 0) {
        out[who[i]].report.append(buf, static_cast<size_t>(n));
      } else {
        closed[who[i]] = true;
        --open_fds;
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    close(fds[r]);
    int status = 0;
    pid_t done = waitpid(pids[r], &status, WNOHANG);
    while (done == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      done = waitpid(pids[r], &status, WNOHANG);
    }
    if (done == 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
      out[r].exit_code = -1;
    } else if (WIFEXITED(status)) {
      out[r].exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      out[r].exit_code = 128 + WTERMSIG(status);
    }
  }
  return out;
}

// A fresh directory under TMPDIR (default /tmp). Every one this process made is removed when it
// exits, whether its test passed or stopped at a failed assertion (callers also remove their own as
// they finish; forked ranks leave with _exit and remove nothing).
inline std::string make_temp_dir(const std::string& stem) {
  static struct Made {
    std::mutex mu;
    std::vector<std::string> dirs;
    ~Made() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  } made;
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/" + stem + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
  std::lock_guard<std::mutex> lock(made.mu);
  made.dirs.push_back(tmpl);
  return tmpl;
}

}  // namespace tessera::testing

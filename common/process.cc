#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <thread>

#include "common/error.h"

extern char** environ;

namespace tessera {

pid_t spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) throw Error("cannot start a process without arguments");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!options.log.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, options.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  for (const auto& [from, to] : options.fds)
    posix_spawn_file_actions_adddup2(&fa, from, to);  // the copy keeps no close-on-exec
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  auto name_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& mine : options.env) replaced = replaced || name_of(mine) == name_of(kv);
    if (!replaced) envs.push_back(kv);
  }
  envs.insert(envs.end(), options.env.begin(), options.env.end());
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string& program = options.program.empty() ? argv[0] : options.program;
  pid_t pid = -1;
  const int rc =
      posix_spawnp(&pid, program.c_str(), &fa, nullptr, args.data(), envp.data());  // a bare name is looked up on PATH
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw Error("cannot start '" + program + "': " + std::strerror(rc));
  return pid;
}

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  return spawn(argv, SpawnOptions{.env = env, .log = log});
}

Process::~Process() {
  if (pid_ > 0 && !status_) stop(std::chrono::milliseconds(0));
}

std::optional<int> Process::poll() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return status_;
}

void Process::terminate() { signal(SIGTERM); }

void Process::signal(int sig) {
  if (!poll()) kill(pid_, sig);
}

int Process::stop(std::chrono::milliseconds grace) {
  if (poll()) return *status_;
  if (grace.count() > 0) {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (std::chrono::steady_clock::now() < deadline) {
      if (poll()) return *status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  kill(pid_, SIGKILL);
  int st = 0;
  waitpid(pid_, &st, 0);
  status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return *status_;
}

std::string Process::describe(int status) {
  if (status > 128) return detail::concat("was killed by signal ", status - 128, " (", strsignal(status - 128), ")");
  return detail::concat("exited with status ", status);
}

}  // namespace tessera

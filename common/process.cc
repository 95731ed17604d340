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

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.push_back(*e);
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), envp.data());  // a bare name is looked up on PATH
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw Error("cannot start '" + argv[0] + "': " + std::strerror(rc));
  return pid;
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

void Process::terminate() {
  if (!poll()) kill(pid_, SIGTERM);
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

// Test support: run one function per rank on its own thread (ranks share the process, so they
// rendezvous through a MemoryStore) and collect what each rank threw.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace tessera::testing {

// Runs fn(rank) for rank in [0, world) concurrently; returns each rank's exception (null if none).
inline std::vector<std::exception_ptr> run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The message of a stored exception, or "" for none.
inline std::string message(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Rethrows the first rank's failure, prefixed with the rank.
inline void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (errors[r]) throw std::runtime_error("rank " + std::to_string(r) + ": " + message(errors[r]));
}

}  // namespace tessera::testing

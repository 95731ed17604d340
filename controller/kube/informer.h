// Informer: a local cache of one kind of Kubernetes object, kept true by list + watch. It lists
// (in pages), then watches from the list's resourceVersion, keeping the newest resourceVersion it
// has seen (bookmarks included); a watch that ends is reopened from there, a 410 Gone (the version
// was compacted away) makes it list again, and an unreachable server is retried with exponential
// backoff (0.2 s doubling to 10 s), saying so once per outage. Every change is handed to the
// handler, on the informer's thread. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "controller/kube/client.h"

namespace tessera::kube {

// "namespace/name", or "name" for cluster-scoped objects.
std::string object_key(const json& object);
// metadata.resourceVersion as a number (etcd revisions), 0 when absent.
uint64_t resource_version(const json& object);

class Informer {
 public:
  // type: ADDED | MODIFIED | DELETED.
  using Handler = std::function<void(const std::string& type, const json& object)>;

  // list_path: "/api/v1/pods" or "/apis/tessera.dev/v1alpha1/namespaces/ml/trainingjobs".
  Informer(const KubeClient& client, std::string list_path, std::string label_selector = "",
           std::string field_selector = "");
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void set_handler(Handler handler);  // REQUIRES: before start()
  // A secondary index: objects by index(object) (empty: not indexed); REQUIRES: before start().
  void set_index(std::function<std::string(const json&)> index);
  std::vector<json> indexed(const std::string& value) const;
  // Grows with every change to the cache (events and remember()), so a reader can tell whether
  // something it derived from the cache is stale.
  uint64_t generation() const { return generation_; }
  void start();
  void stop();
  // Whether the first list has completed.
  bool synced() const { return synced_; }
  bool wait_synced(std::chrono::milliseconds timeout) const;

  std::vector<json> list() const;
  std::optional<json> get(const std::string& key) const;
  // Objects the handler would pick, without copying the cache: f(object) for each.
  void for_each(const std::function<void(const json&)>& f) const;
  // Stores an object this process just wrote, when it is newer than the cached one, so that the
  // next reconcile sees its own write before the watch delivers it.
  void remember(const json& object);

 private:
  void run();
  void relist();
  void apply(const std::string& type, const json& object);

  const KubeClient& client_;
  std::string path_, label_selector_, field_selector_;
  Handler handler_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, json> objects_;  // GUARDED_BY(mu_)
  std::function<std::string(const json&)> index_;
  std::map<std::string, std::set<std::string>> by_index_;  // GUARDED_BY(mu_): index value -> keys
  std::atomic<uint64_t> generation_{0};
  void put_locked(const std::string& key, const json& object);
  void erase_locked(const std::string& key);
  uint64_t version_ = 0;  // the newest resourceVersion seen; informer thread only
  std::atomic<bool> synced_{false}, stop_{false};
  std::thread thread_;
};

}  // namespace tessera::kube

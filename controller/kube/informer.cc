#include "controller/kube/informer.h"

#include <set>

#include "common/log.h"

namespace tessera::kube {

std::string object_key(const json& object) {
  const json& m = object.at("metadata");
  const std::string ns = m.value("namespace", "");
  return ns.empty() ? m.value("name", "") : ns + "/" + m.value("name", "");
}

uint64_t resource_version(const json& object) {
  if (!object.contains("metadata")) return 0;
  const std::string v = object["metadata"].value("resourceVersion", "");
  try {
    return v.empty() ? 0 : std::stoull(v);
  } catch (const std::exception&) {
    return 0;
  }
}

Informer::Informer(const KubeClient& client, std::string list_path, std::string label_selector,
                   std::string field_selector)
    : client_(client),
      path_(std::move(list_path)),
      label_selector_(std::move(label_selector)),
      field_selector_(std::move(field_selector)) {}

Informer::~Informer() { stop(); }

void Informer::set_handler(Handler handler) { handler_ = std::move(handler); }
void Informer::set_index(std::function<std::string(const json&)> index) { index_ = std::move(index); }

std::vector<json> Informer::indexed(const std::string& value) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<json> out;
  auto it = by_index_.find(value);
  if (it != by_index_.end())
    for (const auto& k : it->second) out.push_back(objects_.at(k));
  return out;
}

void Informer::put_locked(const std::string& key, const json& object) {
  auto it = objects_.find(key);
  if (index_ && it != objects_.end()) {
    const std::string old = index_(it->second);
    if (!old.empty()) by_index_[old].erase(key);
  }
  objects_[key] = object;
  if (index_) {
    const std::string v = index_(object);
    if (!v.empty()) by_index_[v].insert(key);
  }
  ++generation_;
}

void Informer::erase_locked(const std::string& key) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  if (index_) {
    const std::string v = index_(it->second);
    if (!v.empty()) {
      by_index_[v].erase(key);
      if (by_index_[v].empty()) by_index_.erase(v);
    }
  }
  objects_.erase(it);
  ++generation_;
}

void Informer::start() {
  thread_ = std::thread([this] { run(); });
}

void Informer::stop() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Informer::wait_synced(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return synced_.load() || stop_.load(); }) && synced_;
}

std::vector<json> Informer::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<json> out;
  out.reserve(objects_.size());
  for (const auto& [k, v] : objects_) out.push_back(v);
  return out;
}

std::optional<json> Informer::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

void Informer::for_each(const std::function<void(const json&)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, v] : objects_) f(v);
}

void Informer::remember(const json& object) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string key = object_key(object);
  auto it = objects_.find(key);
  if (it == objects_.end() || resource_version(object) > resource_version(it->second)) put_locked(key, object);
}

void Informer::apply(const std::string& type, const json& object) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = object_key(object);
    if (type == "DELETED") erase_locked(key);
    else {
      // A write of ours may already be cached (remember()); never go back to an older version.
      auto it = objects_.find(key);
      if (it != objects_.end() && resource_version(it->second) > resource_version(object)) return;
      put_locked(key, object);
    }
  }
  if (handler_) handler_(type, object);
}

void Informer::relist() {
  std::map<std::string, json> fresh;
  std::string next;
  uint64_t version = 0;
  do {
    std::string q = path_ + "?limit=500";
    if (!label_selector_.empty()) q += "&labelSelector=" + url_encode(label_selector_);
    if (!field_selector_.empty()) q += "&fieldSelector=" + url_encode(field_selector_);
    if (!next.empty()) q += "&continue=" + url_encode(next);
    const json page = client_.get(q);
    for (const auto& item : page.value("items", json::array())) fresh[object_key(item)] = item;
    next = page["metadata"].value("continue", "");
    version = std::stoull(page["metadata"].value("resourceVersion", "0"));
  } while (!next.empty());
  std::vector<std::pair<std::string, json>> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, v] : objects_)
      if (!fresh.count(k)) events.push_back({"DELETED", v});
    for (const auto& [k, v] : fresh) {
      auto it = objects_.find(k);
      if (it == objects_.end()) events.push_back({"ADDED", v});
      else if (resource_version(it->second) != resource_version(v)) events.push_back({"MODIFIED", v});
    }
    // Objects written by this process after the list began stay (they are newer).
    for (auto& [k, v] : fresh) {
      auto it = objects_.find(k);
      if (it != objects_.end() && resource_version(it->second) > resource_version(v)) v = it->second;
    }
    objects_.clear();
    by_index_.clear();
    for (const auto& [k, v] : fresh) put_locked(k, v);
  }
  version_ = version;
  synced_ = true;
  cv_.notify_all();
  if (handler_)
    for (const auto& [type, object] : events) handler_(type, object);
}

void Informer::run() {
  auto backoff = std::chrono::milliseconds(200);
  bool need_list = true, said = false;
  while (!stop_) {
    try {
      if (need_list) {
        relist();
        need_list = false;
      }
      std::string q =
          path_ + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=240&resourceVersion=" + std::to_string(version_);
      if (!label_selector_.empty()) q += "&labelSelector=" + url_encode(label_selector_);
      if (!field_selector_.empty()) q += "&fieldSelector=" + url_encode(field_selector_);
      bool gone = false;
      client_.watch(
          q,
          [&](const std::string& type, const json& object) {
            if (type == "ERROR") {
              // A Status: 410 Gone when the version is too old.
              if (object.value("code", 0) == 410) gone = true;
              else log_warn("watch ", path_, ": ", object.value("message", object.dump()));
              return false;
            }
            version_ = std::max(version_, resource_version(object));
            if (type != "BOOKMARK") apply(type, object);
            return true;
          },
          &stop_);
      if (gone) need_list = true;
      if (said) log_info("watch ", path_, ": connected again");
      said = false;
      backoff = std::chrono::milliseconds(200);
    } catch (const ApiError& e) {
      if (e.gone()) {
        need_list = true;
        continue;
      }
      if (!said) log_warn(e.what(), "; retrying with backoff");
      said = true;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, backoff, [this] { return stop_.load(); });
      backoff = std::min(backoff * 2, std::chrono::milliseconds(10000));
    } catch (const std::exception& e) {
      log_warn("watch ", path_, ": ", e.what(), "; listing again");
      need_list = true;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, backoff, [this] { return stop_.load(); });
      backoff = std::min(backoff * 2, std::chrono::milliseconds(10000));
    }
  }
}

}  // namespace tessera::kube

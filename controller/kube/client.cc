#include "controller/kube/client.h"

#include "common/flags.h"

#include <curl/curl.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace tessera::kube {
namespace {

namespace fs = std::filesystem;

const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

std::string read_file(const std::string& file, const std::string& what) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError(what, "cannot read '" + file + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// The entry of a kubeconfig list (clusters, users, contexts) with this name.
YAML::Node named(const YAML::Node& list, const std::string& name, const std::string& what, const std::string& file) {
  if (list && list.IsSequence())
    for (const auto& e : list)
      if (e["name"] && e["name"].as<std::string>() == name) return e;
  throw ConfigError(file, what + " '" + name + "' is not defined");
}

std::string scalar(const YAML::Node& n, const char* key) {
  return n && n[key] && n[key].IsScalar() ? n[key].as<std::string>() : std::string();
}

std::string resolve(const std::string& path, const std::string& base) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base).parent_path() / path).string();
}

size_t write_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct WatchState {
  std::string buffer;
  const std::function<bool(const std::string&, const json&)>* on_event;
  const std::atomic<bool>* stop;
  bool cancelled = false;
  long code = 0;
  std::string error_body;
  std::exception_ptr error;
};

size_t write_watch(char* data, size_t size, size_t n, void* p) {
  auto* w = static_cast<WatchState*>(p);
  w->buffer.append(data, size * n);
  size_t start = 0;
  for (;;) {
    const size_t nl = w->buffer.find('\n', start);
    if (nl == std::string::npos) break;
    const std::string line = w->buffer.substr(start, nl - start);
    start = nl + 1;
    if (line.empty()) continue;
    try {
      json event = json::parse(line);
      if (!event.contains("type")) {  // a Status object: the watch could not be opened
        w->error_body = line;
        continue;
      }
      if (!(*w->on_event)(event["type"].get<std::string>(), event["object"])) {
        w->cancelled = true;
        return 0;
      }
    } catch (...) {
      w->error = std::current_exception();
      return 0;
    }
  }
  w->buffer.erase(0, start);
  return size * n;
}

int watch_progress(void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* w = static_cast<WatchState*>(p);
  if (w->stop && w->stop->load()) {
    w->cancelled = true;
    return 1;
  }
  return 0;
}

ApiError error_of(const std::string& method, const std::string& path, const Response& r) {
  std::string reason, message;
  if (r.body.is_object()) {
    reason = r.body.value("reason", "");
    message = r.body.value("message", "");
  }
  if (message.empty()) message = detail::concat("HTTP ", r.code);
  return ApiError(r.code, reason, detail::concat(method, " ", path, ": ", message));
}

}  // namespace

KubeConfig KubeConfig::from_file(const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    throw ConfigError("--kubeconfig", "cannot read '" + file + "': " + e.what());
  }
  KubeConfig c;
  c.source = file;
  std::string context_name = scalar(root, "current-context");
  if (context_name.empty()) throw ConfigError(file, "no current-context");
  const YAML::Node context = named(root["contexts"], context_name, "context", file)["context"];
  const YAML::Node cluster = named(root["clusters"], scalar(context, "cluster"), "cluster", file)["cluster"];
  const YAML::Node user = named(root["users"], scalar(context, "user"), "user", file)["user"];
  if (!scalar(context, "namespace").empty()) c.default_namespace = scalar(context, "namespace");
  c.server = scalar(cluster, "server");
  if (c.server.empty()) throw ConfigError(file, "cluster '" + scalar(context, "cluster") + "' has no server");
  c.insecure = scalar(cluster, "insecure-skip-tls-verify") == "true";
  c.ca_file = resolve(scalar(cluster, "certificate-authority"), file);
  if (!scalar(cluster, "certificate-authority-data").empty())
    c.ca_data = base64_decode(scalar(cluster, "certificate-authority-data"), file + ": certificate-authority-data");
  c.token = scalar(user, "token");
  c.token_file = resolve(scalar(user, "tokenFile"), file);
  c.cert_file = resolve(scalar(user, "client-certificate"), file);
  c.key_file = resolve(scalar(user, "client-key"), file);
  if (!scalar(user, "client-certificate-data").empty())
    c.cert_data = base64_decode(scalar(user, "client-certificate-data"), file + ": client-certificate-data");
  if (!scalar(user, "client-key-data").empty())
    c.key_data = base64_decode(scalar(user, "client-key-data"), file + ": client-key-data");
  if (user && (user["exec"] || user["auth-provider"]) && c.token.empty() && c.token_file.empty() &&
      c.cert_file.empty() && c.cert_data.empty())
    throw ConfigError(
        file, "user '" + scalar(context, "user") +
                  "' authenticates with an exec or auth-provider plugin, which tessera-controller does not run; "
                  "use a token or a client certificate");
  return c;
}

KubeConfig KubeConfig::in_cluster() {
  const auto host = env_value("KUBERNETES_SERVICE_HOST");
  if (!host || !env_value("KUBERNETES_SERVICE_PORT"))
    throw ConfigError("--kubeconfig", "not given, and KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod)");
  const int64_t port = env_int("KUBERNETES_SERVICE_PORT", 0, 1, 65535);
  KubeConfig c;
  c.source = "in-cluster";
  const std::string& h = *host;
  c.server = "https://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(port);
  c.token_file = std::string(kServiceAccountDir) + "/token";
  c.ca_file = std::string(kServiceAccountDir) + "/ca.crt";
  read_file(c.token_file, "service account token");
  const std::string ns_file = std::string(kServiceAccountDir) + "/namespace";
  if (fs::exists(ns_file)) c.default_namespace = trim(read_file(ns_file, "service account namespace"));
  return c;
}

struct KubeClient::Handle {
  CURL* curl = nullptr;
  ~Handle() {
    if (curl) curl_easy_cleanup(curl);
  }
};

KubeClient::KubeClient(KubeConfig config) : config_(std::move(config)) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  while (!config_.server.empty() && config_.server.back() == '/') config_.server.pop_back();
}

KubeClient::~KubeClient() = default;

KubeClient::Handle& KubeClient::handle() const {
  // One connection per thread and client, kept alive between requests.
  thread_local std::unordered_map<const KubeClient*, std::unique_ptr<Handle>> handles;
  auto& h = handles[this];
  if (!h) {
    h = std::make_unique<Handle>();
    h->curl = curl_easy_init();
  }
  return *h;
}

std::string KubeClient::bearer() const {
  if (!config_.token.empty()) return config_.token;
  if (config_.token_file.empty()) return "";
  // Projected service-account tokens rotate: re-read the file now and then.
  static std::mutex mu;
  static std::unordered_map<std::string, std::pair<std::chrono::steady_clock::time_point, std::string>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& entry = cache[config_.token_file];
  if (entry.second.empty() || std::chrono::steady_clock::now() - entry.first > std::chrono::seconds(60))
    entry = {std::chrono::steady_clock::now(), trim(read_file(config_.token_file, "token file"))};
  return entry.second;
}

void KubeClient::configure(void* handle, const std::string& url) const {
  CURL* curl = static_cast<CURL*>(handle);
  curl_easy_reset(curl);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  if (config_.insecure) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!config_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, config_.ca_file.c_str());
  if (!config_.ca_data.empty()) {
    curl_blob blob{const_cast<char*>(config_.ca_data.data()), config_.ca_data.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &blob);
  }
  if (!config_.cert_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, config_.cert_file.c_str());
  if (!config_.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, config_.key_file.c_str());
  if (!config_.cert_data.empty()) {
    curl_blob blob{const_cast<char*>(config_.cert_data.data()), config_.cert_data.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_SSLCERT_BLOB, &blob);
    curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
  }
  if (!config_.key_data.empty()) {
    curl_blob blob{const_cast<char*>(config_.key_data.data()), config_.key_data.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, CURLOPT_SSLKEY_BLOB, &blob);
    curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
  }
}

Response KubeClient::request(const std::string& method, const std::string& path, const json* body,
                             const std::string& content_type) const {
  ++requests_;
  CURL* curl = handle().curl;
  configure(curl, config_.server + path);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 30000L);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  const std::string token = bearer();
  const std::string auth = "Authorization: Bearer " + token;
  if (!token.empty()) headers = curl_slist_append(headers, auth.c_str());
  std::string payload;
  if (body) {
    payload = body->dump();
    headers = curl_slist_append(headers, ("Content-Type: " + content_type).c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, payload.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  std::string out;
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &out);
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK)
    throw ApiError(0, "Unreachable",
                   detail::concat("cannot reach the API server ", config_.server, " (", method, " ", path,
                                  "): ", curl_easy_strerror(rc)));
  Response r;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.code);
  r.body = json::parse(out, nullptr, false);
  if (r.body.is_discarded()) r.body = nullptr;
  return r;
}

json KubeClient::get(const std::string& path) const {
  Response r = request("GET", path);
  if (r.code / 100 != 2) throw error_of("get", path, r);
  return r.body;
}

json KubeClient::create(const std::string& path, const json& object) const {
  Response r = request("POST", path, &object);
  if (r.code / 100 != 2) throw error_of("create", path, r);
  return r.body;
}

json KubeClient::replace(const std::string& path, const json& object) const {
  Response r = request("PUT", path, &object);
  if (r.code / 100 != 2) throw error_of("update", path, r);
  return r.body;
}

json KubeClient::merge_patch(const std::string& path, const json& patch) const {
  Response r = request("PATCH", path, &patch, "application/merge-patch+json");
  if (r.code / 100 != 2) throw error_of("patch", path, r);
  return r.body;
}

bool KubeClient::remove(const std::string& path, const json& options) const {
  Response r = request("DELETE", path, &options);
  if (r.code == 404) return false;
  if (r.code / 100 != 2) throw error_of("delete", path, r);
  return true;
}

void KubeClient::watch(const std::string& path,
                       const std::function<bool(const std::string& type, const json& object)>& on_event,
                       const std::atomic<bool>* stop) const {
  ++requests_;
  CURL* curl = curl_easy_init();
  configure(curl, config_.server + path);
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  const std::string token = bearer();
  const std::string auth = "Authorization: Bearer " + token;
  if (!token.empty()) headers = curl_slist_append(headers, auth.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  WatchState state;
  state.on_event = &on_event;
  state.stop = stop;
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_watch);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, watch_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &state);
  // A watch that stays silent longer than this is taken as broken (the server's timeoutSeconds ends it sooner).
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, 600L);
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (state.error) std::rethrow_exception(state.error);
  if (state.cancelled) return;
  if (code != 0 && code / 100 != 2) {
    Response r{code, json::parse(state.buffer + state.error_body, nullptr, false)};
    if (r.body.is_discarded()) r.body = nullptr;
    throw error_of("watch", path, r);
  }
  if (!state.error_body.empty()) {
    Response r{code, json::parse(state.error_body, nullptr, false)};
    if (r.body.is_object() && r.body.contains("code")) r.code = r.body["code"].get<long>();
    throw error_of("watch", path, r);
  }
  if (rc != CURLE_OK)
    throw ApiError(0, "Unreachable",
                   detail::concat("watch ", path, " on ", config_.server, ": ", curl_easy_strerror(rc)));
}

std::string base64_decode(const std::string& in, const std::string& what) {
  static const std::string chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    const auto pos = chars.find(c);
    if (pos == std::string::npos) throw ConfigError(what, "is not base64");
    val = (val << 6) + static_cast<int>(pos);
    bits += 6;
    if (bits >= 0) {
      out.push_back(static_cast<char>((val >> bits) & 0xFF));
      bits -= 8;
    }
  }
  return out;
}

std::string core_path(const std::string& ns, const std::string& resource, const std::string& name) {
  std::string p = "/api/v1";
  if (!ns.empty()) p += "/namespaces/" + ns;
  p += "/" + resource;
  if (!name.empty()) p += "/" + name;
  return p;
}

std::string group_path(const std::string& group_version, const std::string& ns, const std::string& resource,
                       const std::string& name) {
  std::string p = "/apis/" + group_version;
  if (!ns.empty()) p += "/namespaces/" + ns;
  p += "/" + resource;
  if (!name.empty()) p += "/" + name;
  return p;
}

std::string url_encode(const std::string& value) {
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out += static_cast<char>(c);
    else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace tessera::kube

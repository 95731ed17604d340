// KubeClient: the Kubernetes API over HTTPS + JSON (libcurl, nlohmann-json). Credentials come from a
// kubeconfig (bearer token or token file, client certificate and key, CA, as files or inline data)
// or from the pod's service account (in-cluster). Thread-safe: each thread keeps its own connection.
//
// Error policy: a configuration that cannot be used throws ConfigError naming the file and the
// field; a request that fails throws ApiError with the HTTP code (0: the server was not reached),
// the API's reason (NotFound, Conflict, AlreadyExists, Forbidden, Gone, ...) and a message naming
// the verb and the resource, so "no permission" reads as "forbidden: cannot create pods in ml".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace tessera::kube {

using json = nlohmann::json;

struct KubeConfig {
  std::string server;                                    // https://host:port
  std::string token, token_file;                         // bearer token, or a file holding it (re-read as it rotates)
  std::string ca_file, ca_data;                          // ca_data: PEM
  std::string cert_file, cert_data, key_file, key_data;  // client certificate (PEM)
  bool insecure = false;                                 // insecure-skip-tls-verify
  std::string default_namespace = "default";
  std::string source;  // the kubeconfig file, or "in-cluster"

  // The current context of a kubeconfig file.
  static KubeConfig from_file(const std::string& file);
  // The pod's service account (KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount).
  static KubeConfig in_cluster();
};

class ApiError : public Error {
 public:
  ApiError(long code, std::string reason, const std::string& message)
      : Error(message), code_(code), reason_(std::move(reason)) {}
  long code() const { return code_; }  // HTTP status; 0 when the server was not reached
  const std::string& reason() const { return reason_; }
  bool not_found() const { return code_ == 404; }
  bool conflict() const { return code_ == 409; }  // a stale resourceVersion, or AlreadyExists
  bool already_exists() const { return code_ == 409 && reason_ == "AlreadyExists"; }
  bool gone() const { return code_ == 410; }
  // Worth trying again later: the server was not reached, or was busy or failing.
  bool transient() const { return code_ == 0 || code_ == 429 || code_ >= 500; }

 private:
  long code_;
  std::string reason_;
};

struct Response {
  long code = 0;
  json body;  // null when the body is not JSON
};

class KubeClient {
 public:
  explicit KubeClient(KubeConfig config);
  ~KubeClient();
  const KubeConfig& config() const { return config_; }

  // One request; any HTTP status is returned. Throws ApiError (code 0) when the server cannot be reached.
  Response request(const std::string& method, const std::string& path, const json* body = nullptr,
                   const std::string& content_type = "application/json") const;

  // The same, throwing ApiError for a status outside 2xx ("verb" names the action in the message).
  json get(const std::string& path) const;
  json create(const std::string& path, const json& object) const;
  json replace(const std::string& path, const json& object) const;
  json merge_patch(const std::string& path, const json& patch) const;
  // DELETE; NotFound is success (returns false). Options: a DeleteOptions body (preconditions, grace period).
  bool remove(const std::string& path, const json& options = json::object()) const;

  // GET path with watch=1: calls on_event(type, object) for every event as it arrives, until the
  // server ends the stream (its timeoutSeconds), on_event returns false, or *stop becomes true.
  // Throws ApiError when the watch cannot be opened (410 Gone included) or breaks.
  void watch(const std::string& path, const std::function<bool(const std::string& type, const json& object)>& on_event,
             const std::atomic<bool>* stop) const;

  // Requests sent so far (watches included), for benchmarks.
  int64_t requests() const { return requests_; }

 private:
  struct Handle;
  Handle& handle() const;  // this thread's connection
  std::string bearer() const;
  void configure(void* curl, const std::string& url) const;
  KubeConfig config_;
  mutable std::atomic<int64_t> requests_{0};
};

// "/api/v1/namespaces/ns/pods" style paths.
std::string core_path(const std::string& ns, const std::string& resource, const std::string& name = "");
std::string group_path(const std::string& group_version, const std::string& ns, const std::string& resource,
                       const std::string& name = "");
// Secret data is base64: decodes it (throws ConfigError naming `what` when it is not base64).
std::string base64_decode(const std::string& in, const std::string& what);
// Percent-encodes a query parameter value (label selectors).
std::string url_encode(const std::string& value);

}  // namespace tessera::kube

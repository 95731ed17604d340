#include "controller/local/pod_runner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/flags.h"

namespace tessera::local {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The last non-empty lines of a file, at most max_chars of them.
std::string last_lines(const std::string& file, size_t max_chars) {
  std::ifstream in(file);
  std::string line, out;
  std::vector<std::string> lines;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  for (auto it = lines.rbegin(); it != lines.rend() && out.size() < max_chars; ++it)
    out = *it + (out.empty() ? "" : "\n") + out;
  return out.size() > max_chars ? out.substr(out.size() - max_chars) : out;
}

json data_of(const PodHost& host, const std::string& resource, const std::string& name, const std::string& reason) {
  const auto data = host.data(resource, name);
  if (!data)
    throw PodStartError(reason, detail::concat(resource == "secrets" ? "secret " : "configmap ", name, " not found"));
  return *data;
}

// Volume name -> the directory that stands for it.
std::map<std::string, std::string> mount_volumes(const json& pod, const PodHost& host) {
  std::map<std::string, std::string> dirs;
  for (const auto& v : pod["spec"].value("volumes", json::array())) {
    const std::string name = v.value("name", "");
    const fs::path dir = fs::path(host.pod_dir) / "volumes" / name;
    if (v.contains("hostPath")) {
      const std::string path = v["hostPath"].value("path", "");
      if (!fs::exists(path)) {
        if (v["hostPath"].value("type", "") != "DirectoryOrCreate")
          throw PodStartError("FailedMount", "hostPath " + path + " of volume " + name + " does not exist");
        fs::create_directories(path);
      }
      dirs[name] = path;
    } else if (v.contains("emptyDir")) {
      fs::create_directories(dir);
      dirs[name] = dir.string();
    } else if (v.contains("configMap") || v.contains("secret")) {
      const bool secret = v.contains("secret");
      const json& src = secret ? v["secret"] : v["configMap"];
      const json data = data_of(host, secret ? "secrets" : "configmaps", src.value(secret ? "secretName" : "name", ""),
                                "FailedMount");
      fs::create_directories(dir);
      std::map<std::string, std::string> items;
      if (src.contains("items"))
        for (const auto& it : src["items"]) items[it.value("key", "")] = it.value("path", "");
      else
        for (auto& [k, val] : data.items()) items[k] = k;
      for (const auto& [k, path] : items) {
        if (!data.contains(k)) throw PodStartError("FailedMount", "key " + k + " is missing from volume " + name);
        std::ofstream(dir / path) << data[k].get<std::string>();
      }
      dirs[name] = dir.string();
    } else {
      throw PodStartError(
          "FailedMount", "volume " + name + ": only hostPath, emptyDir, configMap and secret volumes are mounted here");
    }
  }
  return dirs;
}

std::string env_value_of(const json& e, const json& pod, const PodHost& host) {
  if (!e.contains("valueFrom")) return e.value("value", "");
  const json& f = e["valueFrom"];
  if (f.contains("fieldRef")) {
    const std::string path = f["fieldRef"].value("fieldPath", "");
    const json& meta = pod["metadata"];
    if (path == "metadata.name") return meta.value("name", "");
    if (path == "metadata.namespace") return meta.value("namespace", "");
    if (path == "metadata.uid") return meta.value("uid", "");
    if (path == "spec.nodeName") return pod["spec"].value("nodeName", "");
    if (path == "status.podIP" || path == "status.hostIP") return host.pod_ip;
    const std::string labels = "metadata.labels['";
    if (path.size() > labels.size() + 2 && path.rfind(labels, 0) == 0 && path.substr(path.size() - 2) == "']")
      return meta.value("labels", json::object())
          .value(path.substr(labels.size(), path.size() - labels.size() - 2), "");
    throw PodStartError("CreateContainerConfigError", "fieldRef " + path + " is not supported here");
  }
  const bool secret = f.contains("secretKeyRef");
  if (!secret && !f.contains("configMapKeyRef"))
    throw PodStartError("CreateContainerConfigError",
                        "env " + e.value("name", "") + ": only value, fieldRef, secretKeyRef and configMapKeyRef");
  const json& ref = secret ? f["secretKeyRef"] : f["configMapKeyRef"];
  const json data =
      data_of(host, secret ? "secrets" : "configmaps", ref.value("name", ""), "CreateContainerConfigError");
  const std::string key = ref.value("key", "");
  if (!data.contains(key))
    throw PodStartError("CreateContainerConfigError", "key " + key + " not found in " + ref.value("name", ""));
  return data[key].get<std::string>();
}

}  // namespace

std::string find_command(const std::string& command, const std::vector<std::string>& dirs) {
  if (command.find('/') != std::string::npos) return command;
  std::vector<std::string> search = dirs;
  const std::string path = env_value("PATH").value_or("");
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find(':', start), path.size());
    search.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  for (const auto& d : search)
    if (!d.empty() && fs::exists(fs::path(d) / command)) return (fs::path(d) / command).string();
  return "";
}

std::vector<RunningContainer> start_pod(const json& pod, const PodHost& host) {
  fs::create_directories(host.pod_dir);
  const std::map<std::string, std::string> volume_dirs = mount_volumes(pod, host);
  std::vector<RunningContainer> out;
  for (const auto& c : pod["spec"].value("containers", json::array())) {
    const std::string name = c.value("name", "");
    // mountPath -> directory, the longest first so nested mounts win.
    std::vector<std::pair<std::string, std::string>> mounts;
    for (const auto& m : c.value("volumeMounts", json::array())) {
      auto it = volume_dirs.find(m.value("name", ""));
      if (it == volume_dirs.end())
        throw PodStartError("CreateContainerConfigError", "volumeMount " + m.value("name", "") + " names no volume");
      std::string dir = it->second;
      if (m.contains("subPath")) dir = (fs::path(dir) / m.value("subPath", "")).string();
      mounts.push_back({m.value("mountPath", ""), dir});
    }
    std::sort(mounts.begin(), mounts.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    auto rewrite = [&](const std::string& s) {
      for (const auto& [mount, dir] : mounts)
        if (mount != dir && s.rfind(mount, 0) == 0 && (s.size() == mount.size() || s[mount.size()] == '/'))
          return dir + s.substr(mount.size());
      return s;
    };
    std::vector<std::string> argv;
    for (const auto& a : c.value("command", json::array())) argv.push_back(rewrite(a.get<std::string>()));
    for (const auto& a : c.value("args", json::array())) argv.push_back(rewrite(a.get<std::string>()));
    if (argv.empty())
      throw PodStartError("CreateContainerError", "container " + name + " has no command (images are not run here)");
    const std::string exe = host.resolve_command(argv[0]);
    if (exe.empty())
      throw PodStartError("CreateContainerError", "command '" + argv[0] + "' of container " + name + " is not found");
    argv[0] = exe;
    argv.insert(argv.begin(), host.command_prefix.begin(), host.command_prefix.end());
    // The termination message file: a file of the pod's, wherever the container names it.
    const std::string message_path = c.value("terminationMessagePath", "/dev/termination-log");
    RunningContainer rc;
    rc.name = name;
    rc.message_file = (fs::path(host.pod_dir) / (name + ".termination-log")).string();
    rc.log = host.log_file ? host.log_file(name) : (fs::path(host.pod_dir) / (name + ".log")).string();
    fs::create_directories(fs::path(rc.log).parent_path());
    std::ofstream(rc.message_file, std::ios::trunc).flush();
    std::vector<std::string> env;
    for (const auto& e : c.value("env", json::array())) {
      const std::string var = e.value("name", "");
      if (host.env_override.count(var)) continue;
      const std::string value = env_value_of(e, pod, host);
      env.push_back(var + "=" + (value == message_path ? rc.message_file : rewrite(value)));
    }
    for (const auto& [var, value] : host.env_override) env.push_back(var + "=" + value);
    env.insert(env.end(), host.extra_env.begin(), host.extra_env.end());
    rc.process = std::make_unique<Process>(argv, env, rc.log);
    out.push_back(std::move(rc));
  }
  return out;
}

std::string termination_message(const RunningContainer& c, bool fallback_to_logs, bool failed) {
  std::ifstream in(c.message_file);
  std::string m((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (m.size() > 4096) m = m.substr(0, 4096);
  if (m.empty() && failed && fallback_to_logs) m = last_lines(c.log, 1024);
  while (!m.empty() && m.back() == '\n') m.pop_back();
  return m;
}

}  // namespace tessera::local

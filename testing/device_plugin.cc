// tessera-device-plugin: the test cluster's GPUs (scripts/test-cluster.sh). A kubelet device plugin
// (API v1beta1, testing/deviceplugin/api.proto) that advertises G devices of nvidia.com/gpu on its
// node, with the IDs NVIDIA's device plugin gives under --device-id-strategy=index ("0".."G-1"),
// and on Allocate sets what NVIDIA's plugin sets for a container: NVIDIA_VISIBLE_DEVICES, the IDs
// it was given. There are no GPUs behind the IDs: the worker trains on its CPUs, and says which
// device each of its ranks was given.
//   tessera-device-plugin --kubelet-dir DIR --devices G [--resource nvidia.com/gpu]
// DIR is the kubelet's device-plugin directory (<root-dir>/device-plugins, where kubelet.sock is).
// It registers again whenever the kubelet's socket is made anew (a kubelet restart).
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/flags.h"
#include "common/log.h"
#include "testing/deviceplugin/api.grpc.pb.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

struct Options {
  std::string kubelet_dir;
  int devices = 0;
  std::string resource = "nvidia.com/gpu";
};

class Plugin final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Plugin(int devices) : devices_(devices) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions*) override {
    return grpc::Status::OK;
  }

  // The device list once, then the stream held open until the plugin stops (no device fails here).
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    v1beta1::ListAndWatchResponse list;
    for (int i = 0; i < devices_; ++i) {
      auto* d = list.add_devices();
      d->set_id(std::to_string(i));
      d->set_health("Healthy");
    }
    if (!writer->Write(list)) return grpc::Status::OK;
    log_info("advertised ", devices_, " devices");
    while (!g_stop && !ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*, const v1beta1::PreferredAllocationRequest*,
                                      v1beta1::PreferredAllocationResponse*) override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no preferred allocation");
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override {
    for (const auto& c : req->container_requests()) {
      std::string ids;
      for (const auto& id : c.devicesids()) ids += (ids.empty() ? "" : ",") + id;
      (*resp->add_container_responses()->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = ids;
      log_info("allocated devices ", ids);
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  int devices_;
};

// The kubelet socket's inode, 0 while it is missing: a new one means a restarted kubelet.
ino_t inode_of(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

void register_with(const std::string& kubelet_sock, const std::string& endpoint, const std::string& resource) {
  auto channel = grpc::CreateChannel("unix://" + kubelet_sock, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest req;
  req.set_version("v1beta1");
  req.set_endpoint(endpoint);
  req.set_resource_name(resource);
  v1beta1::Empty resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::Status s = stub->Register(&ctx, req, &resp);
  if (!s.ok()) throw Error("the kubelet at " + kubelet_sock + " refused the registration: " + s.error_message());
  log_info("registered ", resource, " with the kubelet (", kubelet_sock, ")");
}

int run(int argc, char** argv) {
  Options o;
  Flags flags("tessera-device-plugin",
              "usage: tessera-device-plugin --kubelet-dir DIR --devices G [--resource nvidia.com/gpu]\n");
  flags.text("--kubelet-dir", &o.kubelet_dir).integer("--devices", &o.devices, 1, 1024).text("--resource", &o.resource);
  if (!flags.parse(argc, argv)) return 0;
  if (o.kubelet_dir.empty()) throw ConfigError("--kubelet-dir", "required");
  if (o.devices == 0) throw ConfigError("--devices", "required");
  set_log_tag("device-plugin");
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);

  const std::string endpoint = "tessera-gpu.sock";
  const std::string own = (fs::path(o.kubelet_dir) / endpoint).string();
  const std::string kubelet = (fs::path(o.kubelet_dir) / "kubelet.sock").string();
  fs::create_directories(o.kubelet_dir);  // the kubelet may not have made it yet
  Plugin plugin(o.devices);
  // The kubelet empties the directory when it starts, so the plugin's socket is served anew (and
  // registered again) each time kubelet.sock is made.
  std::unique_ptr<grpc::Server> server;
  ino_t registered = 0;
  while (!g_stop) {
    const ino_t now = inode_of(kubelet);
    if (now != 0 && now != registered) {
      if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      fs::remove(own);
      grpc::ServerBuilder builder;
      builder.AddListeningPort("unix://" + own, grpc::InsecureServerCredentials());
      builder.RegisterService(&plugin);
      server = builder.BuildAndStart();
      if (!server) throw Error("cannot serve the device plugin on " + own);
      try {
        register_with(kubelet, endpoint, o.resource);
        registered = now;
      } catch (const Error& e) {
        log_warn(e.what(), "; trying again");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  fs::remove(own);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_command("tessera-device-plugin", [&] { return tessera::run(argc, argv); });
}

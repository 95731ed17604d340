// The channel workers use to reach the controller: reconnect backoff kept short (about 50 ms) so a
// worker that starts before the controller waits only as long as it must. Internal to the worker's
// gRPC clients (GrpcStore, ControlAgent).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace tessera {

// A refusal that a controller coming back may lift: it is unreachable, it stopped while answering
// (a controller shut down cleanly cancels the calls it was serving), or it does not know the job
// yet (it is rebuilding its jobs after a restart).
inline bool controller_may_return(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::CANCELLED ||
         s.error_code() == grpc::StatusCode::NOT_FOUND;
}

// The largest message to or from the controller (its rendezvous refuses larger ones too).
inline constexpr int kControllerMessageBytes = 2 << 20;

inline std::shared_ptr<grpc::Channel> controller_channel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // The controller's messages are small (rendezvous keys, heartbeats): refuse anything that is not.
  args.SetMaxReceiveMessageSize(kControllerMessageBytes);
  args.SetMaxSendMessageSize(kControllerMessageBytes);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace tessera

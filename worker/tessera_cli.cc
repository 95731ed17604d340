// tessera: the command-line tool.
//
//   tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32]
//       writes a dataset of HDF5 sample files (chunked, compressed) and its manifest.tsv
//   tessera data verify DIR
//       reads every file of a dataset and checks it against the manifest
//
// Exit status: 0 done, 2 bad arguments, 1 any other failure (the message names the file).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "worker/core/error.h"
#include "worker/core/log.h"
#include "worker/data/h5_dataset.h"

namespace tessera {
namespace {

int usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage:\n"
               "  tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32]\n"
               "  tessera data verify DIR\n");
  return code;
}

long number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end) throw ConfigError(flag, "'" + v + "' is not an integer");
  return x;
}

int data_generate(int argc, char** argv) {
  std::string kind, out;
  long samples = -1, size = -1, seed = 1;
  bool int16 = true;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    if (a == "--kind") kind = value();
    else if (a == "--samples") samples = number(a, value());
    else if (a == "--size") size = number(a, value());
    else if (a == "--out") out = value();
    else if (a == "--seed") seed = number(a, value());
    else if (a == "--float32") int16 = false;
    else throw ConfigError(a, "unknown flag");
  }
  if (kind.empty()) throw ConfigError("--kind", "required (cosmoflow or unet)");
  if (samples < 1) throw ConfigError("--samples", "required, a positive integer");
  if (size < 4) throw ConfigError("--size", "required, at least 4");
  if (out.empty()) throw ConfigError("--out", "required");
  generate_dataset(kind, static_cast<uint64_t>(samples), static_cast<int>(size), out, static_cast<uint64_t>(seed), int16);
  std::printf("wrote %ld %s samples of size %ld to %s\n", samples, kind.c_str(), size, out.c_str());
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "data") return usage(2);
  const std::string cmd = argv[2];
  if (cmd == "generate") return data_generate(argc, argv);
  if (cmd == "verify") {
    if (argc != 4) return usage(2);
    verify_dataset(argv[3]);
    std::printf("%s: every sample matches the manifest\n", argv[3]);
    return 0;
  }
  return usage(2);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  try {
    return tessera::run(argc, argv);
  } catch (const tessera::ConfigError& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: %s\n", e.what());
    return 1;
  }
}

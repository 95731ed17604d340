#include "worker/data/tokens.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "worker/data/filesystem.h"
#include "worker/nn/kernels.h"

namespace tessera {
namespace {

constexpr const char* kFortunes = "/usr/share/games/fortunes";

}  // namespace

std::vector<uint32_t> read_tokens(const TokenFile& file) {
  if (file.token_bytes != 2 && file.token_bytes != 4)
    throw ConfigError("dataset.tokenBytes",
                      detail::concat(file.token_bytes, ": token ids are 2 (uint16) or 4 (uint32) bytes"));
  if (file.vocab_size == 0) throw ConfigError("dataset.vocabSize", "required: the number of distinct token ids");
  const std::string bytes = PosixFileSystem().read(file.path);
  if (bytes.empty()) throw ConfigError(file.path, "holds no tokens");
  if (bytes.size() % file.token_bytes != 0)
    throw ConfigError(file.path, detail::concat(bytes.size(), " bytes is not a whole number of ", file.token_bytes,
                                                "-byte tokens (was it written as uint", 8 * file.token_bytes, "?)"));
  const size_t n = bytes.size() / file.token_bytes;
  std::vector<uint32_t> ids(n);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    for (int b = file.token_bytes - 1; b >= 0; --b) v = (v << 8) | p[i * file.token_bytes + b];  // little-endian
    if (v >= file.vocab_size)
      throw ConfigError(file.path, detail::concat("token ", i, " is id ", v, ", not below the vocabulary size ",
                                                  file.vocab_size, " (dataset.vocabSize)"));
    ids[i] = v;
  }
  return ids;
}

TokenDataset::TokenDataset(const TokenFile& file, int context, uint64_t seed, uint64_t windows)
    : tokens_(read_tokens(file)), context_(context), seed_(seed) {
  if (context < 1) throw ConfigError("model.context", detail::concat(context, ": must be at least 1"));
  if (tokens_.size() < static_cast<size_t>(context) + 1)
    throw ConfigError(file.path, detail::concat("holds ", tokens_.size(), " tokens; a window of context ", context,
                                                " needs at least ", context + 1));
  // By default as many windows as the file holds side by side: an epoch reads about every token once.
  windows_ = windows ? windows : (tokens_.size() - 1) / static_cast<uint64_t>(context);
}

uint64_t TokenDataset::offset(uint64_t index) const {
  const uint64_t starts = tokens_.size() - static_cast<uint64_t>(context_);  // offsets 0 .. size - context - 1
  return kernels::mix64(kernels::mix64(seed_) ^ index) % starts;
}

Sample TokenDataset::get(uint64_t index) const {
  TESSERA_CHECK_LT(index, windows_, "window index");
  const uint64_t at = offset(index);
  Sample s{Tensor({context_}), Tensor({context_})};
  for (int64_t i = 0; i < context_; ++i) {
    s.input[i] = static_cast<float>(tokens_[at + i]);
    s.target[i] = static_cast<float>(tokens_[at + i + 1]);
  }
  return s;
}

std::vector<std::string> default_text_sources() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kFortunes, ec)) {
    if (!e.is_regular_file(ec) || e.path().has_extension()) continue;  // not the .dat indexes nor the .u8 links
    if (e.path().filename() == "ascii-art" || e.path().filename() == "art") continue;  // pictures, not language
    files.push_back(e.path().string());
  }
  if (files.empty())
    throw ConfigError(
        "--source",
        detail::concat("no text in ", kFortunes,
                       ": install the Debian package fortunes (make deps does), or name files with --source"));
  std::sort(files.begin(), files.end());
  return files;
}

uint64_t generate_text_tokens(const std::string& out_dir, std::vector<std::string> sources, double validation_fraction,
                              bool replace) {
  if (!(validation_fraction > 0 && validation_fraction < 1))
    throw ConfigError("--validation-fraction", detail::concat(validation_fraction, ": must lie between 0 and 1"));
  if (sources.empty()) sources = default_text_sources();
  const std::string train = out_dir + "/train.bin", val = out_dir + "/val.bin", meta = out_dir + "/meta.json";
  std::error_code ec;
  if (!replace)
    for (const auto& f : {train, val, meta})
      if (std::filesystem::exists(f, ec)) throw ConfigError("--out", "'" + f + "' exists (--replace overwrites it)");
  std::string text;
  for (const auto& f : sources) {
    const std::string t = PosixFileSystem().read(f);
    if (t.empty()) throw ConfigError("--source", "'" + f + "' is empty");
    text += t;
    if (text.back() != '\n') text += '\n';
  }
  const size_t n_val = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(text.size()) * validation_fraction));
  if (n_val >= text.size())
    throw ConfigError("--source", detail::concat(text.size(), " bytes of text are too few to split"));
  auto tokens = [](std::string_view bytes) {  // one uint16 id per byte, little-endian
    std::string out(2 * bytes.size(), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) out[2 * i] = bytes[i];
    return out;
  };
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw IoError(out_dir, ec.message());
  const std::string_view all(text);
  write_file_atomic(train, tokens(all.substr(0, text.size() - n_val)));
  write_file_atomic(val, tokens(all.substr(text.size() - n_val)));
  nlohmann::ordered_json m = {{"vocabSize", 256},     {"dtype", "uint16"},
                              {"tokenizer", "bytes"}, {"trainTokens", text.size() - n_val},
                              {"valTokens", n_val},   {"sources", sources}};
  write_file_atomic(meta, m.dump(2) + "\n");
  return text.size();
}

bool is_token_dir(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(dir) / "train.bin", ec);
}

TokenFilesIndex index_token_files(const std::string& dir, uint32_t vocab_size, int token_bytes) {
  const std::string meta = dir + "/meta.json";
  nlohmann::json m = nlohmann::json::object();
  std::error_code ec;
  if (std::filesystem::exists(meta, ec)) {
    m = nlohmann::json::parse(PosixFileSystem().read(meta), nullptr, false);
    if (!m.is_object()) throw ConfigError(meta, "is not a JSON object");
  }
  if (vocab_size == 0 && m.contains("vocabSize") && m["vocabSize"].is_number_unsigned())
    vocab_size = m["vocabSize"].get<uint32_t>();
  if (token_bytes == 0) token_bytes = m.value("dtype", std::string("uint16")) == "uint32" ? 4 : 2;
  if (vocab_size == 0)
    throw ConfigError("--vocab-size",
                      detail::concat("required for the token files under '", dir,
                                     "' (no meta.json with vocabSize beside them): every token id is below "
                                     "it (50257 for GPT-2's tokenizer, 256 for bytes)"));
  const std::string val = dir + "/val.bin";
  if (!std::filesystem::exists(val, ec))
    throw ConfigError(dir, "has train.bin but no val.bin: training validates on val.bin (nanoGPT's layout)");
  const uint64_t train_tokens = read_tokens({dir + "/train.bin", token_bytes, vocab_size}).size();
  const uint64_t val_tokens = read_tokens({val, token_bytes, vocab_size}).size();
  nlohmann::ordered_json out = nlohmann::ordered_json::parse(m.dump());
  out["vocabSize"] = vocab_size;
  out["dtype"] = token_bytes == 4 ? "uint32" : "uint16";
  out["trainTokens"] = train_tokens;
  out["valTokens"] = val_tokens;
  if (nlohmann::json::parse(out.dump()) != m) write_file_atomic(meta, out.dump(2) + "\n");
  return {vocab_size, token_bytes, train_tokens, val_tokens};
}

}  // namespace tessera

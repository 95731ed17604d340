// Token files for language models, as nanoGPT's prepare scripts write them: train.bin and val.bin,
// each a flat array of little-endian token ids (uint16 or uint32, no header), the vocabulary size
// stated beside them (meta.json here; the manifest's dataset fields for files made elsewhere).
//
// A TokenDataset serves windows of `context` tokens: sample i is the window at a random offset drawn
// from (seed, i), its target the same window one token later, so an epoch's permutation and the
// data-parallel sharding of dataset.h apply unchanged and every rank reads only its own windows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/dataset.h"

namespace tessera {

struct TokenFile {
  std::string path;
  int token_bytes = 2;      // 2 (uint16) or 4 (uint32)
  uint32_t vocab_size = 0;  // every id must be below it
};

// The ids of `file`, checked: IoError when it cannot be read; ConfigError (naming the file) when its
// size is not a whole number of tokens, it is empty, or an id is not below the vocabulary size.
std::vector<uint32_t> read_tokens(const TokenFile& file);

class TokenDataset final : public Dataset {
 public:
  // `windows` samples (0: as many as the file holds side by side). ConfigError when the file holds
  // fewer than context + 1 tokens.
  TokenDataset(const TokenFile& file, int context, uint64_t seed, uint64_t windows = 0);
  uint64_t size() const override { return windows_; }
  Sample get(uint64_t index) const override;  // input and target: (context) ids as floats
  Shape input_shape() const override { return {context_}; }
  Shape target_shape() const override { return {context_}; }
  // The offset of window `index` in the file.
  uint64_t offset(uint64_t index) const;

 private:
  std::vector<uint32_t> tokens_;
  int64_t context_;
  uint64_t seed_;
  uint64_t windows_;
};

// `tessera data generate --kind text`: byte-level tokens (vocabulary 256) of English text, the
// fortunes Debian package's files unless `sources` names others, written to out_dir as train.bin
// and val.bin (uint16; the last `validation_fraction` of the text is val.bin) with meta.json
// ({"vocabSize": 256, "dtype": "uint16", ...}). Refuses to overwrite unless `replace`. Returns the
// number of tokens written.
uint64_t generate_text_tokens(const std::string& out_dir, std::vector<std::string> sources, double validation_fraction,
                              bool replace);

// Whether dir holds nanoGPT's token files (train.bin; val.bin beside it).
bool is_token_dir(const std::string& dir);
// `tessera data index` of token files: train.bin and val.bin under dir checked as training reads them
// (read_tokens), with the vocabulary size and token width given (0: meta.json's vocabSize and
// dtype, else none and 2 bytes), then dir/meta.json written (vocabSize, dtype, the files' tokens)
// unless it holds the same already. ConfigError naming the file or the flag (--vocab-size) that
// is wrong or missing.
struct TokenFilesIndex {
  uint32_t vocab_size = 0;
  int token_bytes = 2;
  uint64_t train_tokens = 0, val_tokens = 0;
};
TokenFilesIndex index_token_files(const std::string& dir, uint32_t vocab_size, int token_bytes);

// The fortunes package's English text files (the fortune cookie files, not their .dat indexes).
std::vector<std::string> default_text_sources();

}  // namespace tessera

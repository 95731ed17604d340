// Checkpoints: named float arrays plus integer counters, written through a FileSystem (atomically:
// FileSystem::write_atomic) with a checksum verified on read. One file per rank and step:
// <dir>/ckpt-<step>-rank<rank>.bin. A torn or corrupt file is an error naming it, never a silent
// partial restore (the trainer then resumes from an older checkpoint every rank can read). I/O errors
// name the path, and a failed write removes its temporary file; nothing is retried.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

class FileSystem;

struct CheckpointData {
  std::map<std::string, int64_t> counters;             // step, optimizer steps, ...
  std::map<std::string, std::vector<float>> arrays;    // parameters, optimizer state, residuals, ...
};

std::string checkpoint_file(const std::string& dir, int64_t step, int rank);
void write_checkpoint(FileSystem& fs, const std::string& dir, int64_t step, int rank, const CheckpointData& data);
CheckpointData read_checkpoint(FileSystem& fs, const std::string& file);
// The checkpoint in `bytes` (as read from `file`, which errors name): its checksum verified, then every
// length checked against what is left, so no input makes it read past the end or allocate more
// than the input's size.
CheckpointData parse_checkpoint(const std::string& bytes, const std::string& file);
// The newest step with a checkpoint of `rank` in dir, if any.
std::optional<int64_t> latest_checkpoint(const std::string& dir, int rank);
// The steps of rank's checkpoints in dir, oldest first.
std::vector<int64_t> checkpoint_steps(const std::string& dir, int rank);
// Deletes this rank's partly written checkpoints (<file>.tmp.*, left by a process stopped while it
// wrote one) and returns how many there were.
int remove_partial_checkpoints(FileSystem& fs, const std::string& dir, int rank);
// Deletes this rank's checkpoints except the newest `keep`.
void prune_checkpoints(FileSystem& fs, const std::string& dir, int rank, int keep);

// The per-bucket arrays `kind`/<bucket> of the `world` ranks that wrote `step` in dir, each placed
// in its bucket at its offset (counter <kind>_offset/<bucket>; 0 when absent) and summed: bucket ->
// the whole bucket's sum over the gang. kind "residual": the error-feedback residuals, what the
// gang still owed; "velocity": momentum correction's velocities, whose sum is the gang's momentum.
// bucket_sizes: the job's buckets. ConfigError at spec.checkpoint.path naming the file when an
// array does not fit them.
std::map<int, std::vector<double>> summed_bucket_arrays(FileSystem& fs, const std::string& dir, int64_t step, int world,
                                                        const std::vector<size_t>& bucket_sizes, const std::string& kind = "residual");

}  // namespace tessera

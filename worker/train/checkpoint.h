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

class Communicator;
class FileSystem;
class GradientExchange;

struct CheckpointData {
  std::map<std::string, int64_t> counters;           // step, optimizer steps, ...
  std::map<std::string, std::vector<float>> arrays;  // parameters, optimizer state, residuals, ...
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
                                                        const std::vector<size_t>& bucket_sizes,
                                                        const std::string& kind = "residual");

// The checkpoint a gang resumes from: the newest step that every rank can read, its data as this
// rank reads it, and the file that came from. step -1: none (training starts at step 0).
struct AgreedCheckpoint {
  int64_t step = -1;
  CheckpointData data;
  std::string file;
};
// Collective over `world` (null: a single process). A rank whose newest checkpoint is torn or
// corrupt says so and offers an older one; the ranks agree on the newest step all of them offer
// (each round can only lower it, and every rank runs the same rounds). Removes this rank's partly
// written files first. An elastic job's steps may have been written by a gang of another size:
// a step counts only when every rank of the gang that wrote it (rank 0's counter "world") finished
// its file, and a rank the writing gang did not have reads the state of rank (rank mod its size).
AgreedCheckpoint agree_checkpoint(FileSystem& fs, const std::string& dir, int rank, bool elastic, Communicator* world);

// The error-feedback residuals of step `step`, written by a gang of `world` ranks of another size
// than this one (elastic), for this rank under `exchange`: every writer's residual summed in its
// bucket, and this rank's share of the sum (its entries of each bucket where `holds`, none
// elsewhere), so that what the gang still owes is neither lost nor counted twice. bucket -> entries.
std::map<int, std::vector<float>> reshard_residuals(FileSystem& fs, const std::string& dir, int64_t step, int world,
                                                    const std::vector<size_t>& bucket_sizes,
                                                    const GradientExchange& exchange, bool holds);

}  // namespace tessera

// Writing a file whole or not at all: the one atomic write of the project (the data cache, the
// checkpoints through FileSystem, and `tessera run`'s status.json).
#pragma once

#include <string>

namespace tessera {

// Writes <path>.tmp.<pid> (several processes may write the same file: each its own temporary file,
// the last rename wins with a whole file), syncs it, renames it to `path` and syncs the directory:
// readers see the old file or the whole new one, never a part, even after a power loss. Throws
// IoError naming the file (no_space() when the disk is full); a failed write removes its temporary
// file.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace tessera

// Writing report files whole or not at all.
#pragma once

#include <string>

namespace tilelab::sim {

// Writes `text` to `path`: a regular file through a temporary file beside it, renamed over it
// once written (a failed write leaves any earlier file untouched and no partial one); an
// existing special file (a device, a pipe) in place. Throws tilelab::Error naming the path and
// the reason (no space, no such directory, permission, a directory).
void write_file_whole(const std::string& path, const std::string& text);

}  // namespace tilelab::sim

// Whole-file writes of reports.
#include "output_file.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>
#include <tilelab/error.hpp>

namespace tilelab::sim {

void write_file_whole(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code code;
  const fs::file_status status = fs::status(path, code);
  const bool special = fs::exists(status) && !fs::is_regular_file(status);
  if (fs::is_directory(status)) throw Error("cannot write '" + path + "': is a directory");
  // Unique per process and call, so that concurrent writers never share a temporary file.
  static std::atomic<unsigned> writes{0};
  const std::string target = special ? path
                                     : path + ".tmp-" + std::to_string(::getpid()) + "-" +
                                           std::to_string(writes.fetch_add(1));
  {
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write '" + path + "': " + std::strerror(errno));
    out << text;
    out.flush();
    out.close();
    if (!out) {
      const std::string reason = std::strerror(errno);
      if (!special) fs::remove(target, code);
      throw Error("cannot write '" + path + "': " + reason);
    }
  }
  if (!special) {
    fs::rename(target, path, code);
    if (code) {
      std::error_code ignored;
      fs::remove(target, ignored);
      throw Error("cannot write '" + path + "': " + code.message());
    }
  }
}

}  // namespace tilelab::sim

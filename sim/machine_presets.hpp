// Built-in machine presets: JSON text of sim/machines/*.json embedded at build time.
#pragma once

#include <vector>

namespace tilelab::sim::detail {

struct MachinePreset {
  const char* name;  // file stem, e.g. "trn1"
  const char* json;  // the file's text
};

// All presets, in file-name order (generated source).
const std::vector<MachinePreset>& machine_presets();

}  // namespace tilelab::sim::detail

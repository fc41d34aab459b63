// Machine JSON text (sim/machines/*.json) -> parse_machine_json. A machine that loads must
// survive a round trip of each field through machine_field_value and set_machine_field.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_outcome.hpp"
#include "sim/machine.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tilelab::fuzz::expect_only_tilelab_errors("parse_machine_json", [&] {
    tilelab::sim::Machine machine = tilelab::sim::parse_machine_json(text, "fuzz input");
    for (const tilelab::sim::MachineField& field : tilelab::sim::machine_fields()) {
      const nlohmann::json value = tilelab::sim::machine_field_value(machine, field.name);
      try {
        tilelab::sim::set_machine_field(machine, field.name, value);
      } catch (const tilelab::Error&) {
        tilelab::fuzz::invariant_broken("a loaded machine rejects one of its own field values");
      }
    }
  });
  return 0;
}

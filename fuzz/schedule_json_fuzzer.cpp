// Paged-attention schedule JSON -> PagedAttentionSchedule::from_json. A schedule that loads must
// read back equal from its own to_json().
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_outcome.hpp"
#include "schedules/paged/schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tilelab::schedules::PagedAttentionSchedule;
  const std::string text(reinterpret_cast<const char*>(data), size);
  tilelab::fuzz::expect_only_tilelab_errors("PagedAttentionSchedule::from_json", [&] {
    const PagedAttentionSchedule schedule = PagedAttentionSchedule::from_json(text);
    PagedAttentionSchedule again;
    try {
      again = PagedAttentionSchedule::from_json(schedule.to_json());
    } catch (const tilelab::Error&) {
      tilelab::fuzz::invariant_broken("a loaded schedule rejects its own to_json()");
    }
    if (!(again == schedule))
      tilelab::fuzz::invariant_broken("to_json/from_json changes a schedule");
  });
  return 0;
}

// Halide's compile-time messages for every generator binary, installed before main. Halide warns
// once per function that converts to or from (b)float16 on a target where it "emulates" the
// conversion. On x86 it always does: its native f32 -> bf16 patterns are disabled (Halide issue
// 7219), and its bf16/f16 conversions are bit operations, what tilelab's kernels ask for on
// purpose (bf16 and f16 I/O, P rounded to bf16 for the bf16 dot products). The warning cannot be
// acted on and filled the build log with hundreds of lines that hid real ones; it is dropped.
// Every other warning, and every error, is reported as Halide would.
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "Halide.h"

namespace {

class GeneratorMessages final : public Halide::CompileTimeErrorReporter {
 public:
  void warning(const char* message) override {
    if (std::strstr(message, "(b)float16 type operation is emulated") != nullptr) return;
    std::cerr << message << std::flush;
  }
  [[noreturn]] void error(const char* message) override {
    std::cerr << message << std::flush;
    std::exit(EXIT_FAILURE);
  }
};

GeneratorMessages generator_messages;

const bool installed = [] {
  Halide::set_custom_compile_time_error_reporter(&generator_messages);
  return true;
}();

}  // namespace

// Functional executor: runs a program on real numbers. Float data is stored as fp32 and rounded
// to the destination dtype (bf16/fp16/fp8, round to nearest even) where an instruction writes it;
// int32 data is stored exactly. Uninitialised memory reads as NaN.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "program.hpp"

namespace tilelab::sim {

// Rounds an fp32 value to `dtype` (round to nearest even; fp16 overflows to inf, fp8 e4m3 to NaN)
// and returns it widened back to fp32. int32 rounds to the nearest integer.
float round_to_dtype(float value, DType dtype);

class FunctionalExecutor {
 public:
  // Keeps a reference to `program`, which must outlive the executor.
  explicit FunctionalExecutor(const Program& program);

  // Sets an HBM tensor's contents (row-major, all elements), rounding to the tensor's dtype.
  void set_tensor(Tensor tensor, std::span<const float> values);
  void set_tensor(const std::string& name, std::span<const float> values);
  // An HBM tensor's contents as floats (NaN where never written).
  std::vector<float> tensor(Tensor tensor) const;
  std::vector<float> tensor(const std::string& name) const;
  // A tile's contents, [partitions x free_elements] row-major.
  std::vector<float> tile(Tile tile) const;  // NaN where never written

  // Executes every instruction in program order. Throws tilelab::Error on run-time faults
  // (e.g. an indirect-DMA index outside the tensor).
  void run();
  // Executes instructions [begin, end) only, so that a caller can look at tiles in between
  // (device_print); run(0, a) then run(a, n) is run().
  void run(size_t begin, size_t end);

 private:
  Tensor find(const std::string& name) const;
  void ensure(uint32_t buffer);
  // Per-element access, inline: the executor's loops call them for every element.
  float load(uint32_t buffer, uint64_t index) const {
    if (program_.buffers[buffer].dtype == DType::int32)
      return static_cast<float>(ints_[buffer][index]);
    return floats_[buffer][index];
  }
  void store(uint32_t buffer, uint64_t index, float value) {
    const DType dtype = program_.buffers[buffer].dtype;
    if (dtype == DType::fp32)
      floats_[buffer][index] = value;
    else if (dtype == DType::int32)
      store_int(buffer, index, value);
    else
      floats_[buffer][index] = round_to_dtype(value, dtype);
  }
  void store_int(uint32_t buffer, uint64_t index, float value);
  // Row p of a view as floats (free_count of them), and back with dst's rounding.
  void read_row(const TileRef& ref, uint32_t p, float* out) const;
  void write_row(const TileRef& ref, uint32_t p, const float* values);
  float load(const TileRef& ref, uint32_t p, uint32_t j) const {
    return load(ref.tile,
                uint64_t(ref.partition_start + p) * program_.buffers[ref.tile].free_elements +
                    ref.free_element(j));
  }
  void store(const TileRef& ref, uint32_t p, uint32_t j, float value) {
    store(ref.tile,
          uint64_t(ref.partition_start + p) * program_.buffers[ref.tile].free_elements +
              ref.free_element(j),
          value);
  }
  void execute(const Instruction& instr);
  void execute_dma(const Instruction& instr);

  const Program& program_;
  std::vector<std::vector<float>> floats_;
  std::vector<std::vector<int32_t>> ints_;
};

}  // namespace tilelab::sim

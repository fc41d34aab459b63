// Names of ISA enumerators, as used in reports and error messages.
#include "isa.hpp"

namespace tilelab::sim {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::fp32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::fp8_e4m3:
      return "fp8_e4m3";
    case DType::int32:
      return "int32";
    case DType::uint8:
      return "uint8";
  }
  return "?";
}

std::string_view memory_name(Memory memory) {
  switch (memory) {
    case Memory::hbm:
      return "hbm";
    case Memory::sbuf:
      return "sbuf";
    case Memory::psum:
      return "psum";
  }
  return "?";
}

std::string_view engine_name(Engine engine) {
  switch (engine) {
    case Engine::tensor:
      return "tensor";
    case Engine::vector:
      return "vector";
    case Engine::scalar:
      return "scalar";
    case Engine::gpsimd:
      return "gpsimd";
    case Engine::sync:
      return "sync";
  }
  return "?";
}

std::string_view opcode_name(Opcode opcode) {
  const int index = static_cast<int>(opcode);
  return index < kOpcodeCount ? kOpcodeTable[index].name : "?";
}

std::string engine_set_name(uint8_t engines) {
  std::string out;
  int remaining = 0;
  for (int e = 0; e < kEngineCount; ++e) remaining += (engines >> e) & 1;
  for (int e = 0; e < kEngineCount; ++e) {
    if (!((engines >> e) & 1)) continue;
    --remaining;
    out += engine_name(static_cast<Engine>(e));
    if (remaining > 1) out += ", ";
    if (remaining == 1) out += " or ";
  }
  return out;
}

std::string_view alu_op_name(AluOp op) {
  switch (op) {
    case AluOp::bypass:
      return "bypass";
    case AluOp::add:
      return "add";
    case AluOp::subtract:
      return "subtract";
    case AluOp::multiply:
      return "multiply";
    case AluOp::divide:
      return "divide";
    case AluOp::max:
      return "max";
    case AluOp::min:
      return "min";
  }
  return "?";
}

std::string_view act_func_name(ActFunc func) {
  switch (func) {
    case ActFunc::copy:
      return "copy";
    case ActFunc::exp:
      return "exp";
    case ActFunc::log:
      return "log";
    case ActFunc::square:
      return "square";
    case ActFunc::relu:
      return "relu";
    case ActFunc::sigmoid:
      return "sigmoid";
    case ActFunc::tanh:
      return "tanh";
    case ActFunc::reciprocal:
      return "reciprocal";
    case ActFunc::sqrt:
      return "sqrt";
    case ActFunc::rsqrt:
      return "rsqrt";
    case ActFunc::abs:
      return "abs";
  }
  return "?";
}

}  // namespace tilelab::sim

// Opcode metadata table: one entry per opcode, read by the builder, the timing and functional
// engines and the reports.
#include "sim/isa.hpp"

#include "test_util.hpp"

using namespace tilelab::sim;
using namespace tilelab::sim::test;
using Catch::Matchers::Contains;

TEST_CASE("isa: the opcode table has one entry per opcode, in enum order", "[sim][isa]") {
  STATIC_REQUIRE(kOpcodeTable.size() == static_cast<size_t>(Opcode::count));
  for (int i = 0; i < kOpcodeCount; ++i) {
    const auto opcode = static_cast<Opcode>(i);
    CHECK(opcode_info(opcode).opcode == opcode);
    CHECK(opcode_name(opcode) == kOpcodeTable[i].name);
  }
  CHECK(opcode_name(Opcode::matmul) == "matmul");
  CHECK(opcode_name(Opcode::count) == "?");
}

TEST_CASE("isa: operand roles say which slots an opcode writes", "[sim][isa]") {
  const OpcodeInfo& act = opcode_info(Opcode::activation);
  CHECK(writes(act.operands[kDst]));
  CHECK(reads(act.operands[kSrc0]));
  CHECK(!writes(act.operands[kAux0]));
  CHECK(writes(act.operands[kAux1]));                        // fused reduce result
  CHECK(reads(opcode_info(Opcode::matmul).operands[kDst]));  // accumulation
  CHECK(writes(opcode_info(Opcode::matmul).operands[kDst]));
  CHECK(opcode_info(Opcode::memset).operands[kSrc0] == OperandRole::none);
  for (const OpcodeInfo& info : kOpcodeTable) {
    CHECK(writes(info.operands[kDst]));
    for (int s = kSrc0; s < kSlotCount; ++s) CHECK((!writes(info.operands[s]) || s == kAux1));
  }
}

TEST_CASE("isa: engines and scalar kinds per opcode", "[sim][isa]") {
  CHECK(can_issue(Opcode::matmul, Engine::tensor));
  CHECK(!can_issue(Opcode::matmul, Engine::vector));
  CHECK(can_issue(Opcode::dma_copy, Engine::sync));
  CHECK(can_issue(Opcode::dma_copy, Engine::gpsimd));
  CHECK(!can_issue(Opcode::dma_gather, Engine::sync));
  CHECK(opcode_info(Opcode::dma_gather).dma);
  CHECK(!opcode_info(Opcode::select).dma);
  CHECK(engine_set_name(opcode_info(Opcode::tensor_copy).engines) == "vector, scalar or gpsimd");
  CHECK(engine_set_name(opcode_info(Opcode::memset).engines) == "vector or gpsimd");
  CHECK(engine_set_name(opcode_info(Opcode::iota).engines) == "gpsimd");
  CHECK(opcode_info(Opcode::tensor_scalar).scalars == (kScalarImmediate | kScalarPerPartition));
  CHECK(opcode_info(Opcode::select).scalars == (kScalarImmediate | kScalarTile));
  CHECK(opcode_info(Opcode::tensor_tensor).scalars == 0);
  CHECK(opcode_info(Opcode::tensor_reduce).op0 == Op0Kind::alu);
  CHECK(opcode_info(Opcode::activation).op0 == Op0Kind::activation);
}

TEST_CASE("isa: the builder's engine check names the allowed engines from the table",
          "[sim][isa]") {
  ProgramBuilder b(trn1(), "t");
  const Tile t = b.sbuf_tile("t", 128, 64, DType::fp32);
  CHECK_THAT(error_of([&] { b.memset(b.view(t), 0.0f, Engine::scalar); }),
             Contains("memset: engine scalar not allowed; vector or gpsimd"));
  CHECK_THAT(error_of([&] { b.tensor_copy(b.view(t), b.view(t), Engine::tensor); }),
             Contains("tensor_copy: engine tensor not allowed; vector, scalar or gpsimd"));
}

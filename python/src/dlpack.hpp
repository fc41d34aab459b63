// The DLPack ABI (dmlc/dlpack, include/dlpack/dlpack.h, version 1.1): the structs a consumer reads
// from a `__dlpack__` capsule. DLPack is a stable C ABI and its header is not packaged here, so
// the few types are declared once, with the upstream names and layouts.
#pragma once

#include <cstdint>

namespace tilelab::python::dlpack {

// DLDeviceType values this consumer tells apart (the rest are named by number in errors).
inline constexpr std::int32_t kDLCPU = 1;
inline constexpr std::int32_t kDLCUDA = 2;

// DLDataTypeCode values.
enum : std::uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e3m4 = 7,
  kDLFloat8_e4m3 = 8,
  kDLFloat8_e4m3b11fnuz = 9,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e4m3fnuz = 11,
  kDLFloat8_e5m2 = 12,
  kDLFloat8_e5m2fnuz = 13,
  kDLFloat8_e8m0fnu = 14,
};

// DLManagedTensorVersioned::flags bits.
inline constexpr std::uint64_t kFlagReadOnly = 1U << 0U;

struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};

struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null means compact row-major
  std::uint64_t byte_offset;
};

// The capsule "dltensor" (the protocol before version 1.0).
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};

// The capsule "dltensor_versioned" (version 1.0 on).
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};

}  // namespace tilelab::python::dlpack

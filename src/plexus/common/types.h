// Value types shared by every component: dtypes, shapes, tensor specs,
// shardings and program attributes. Plain data; safe to copy between threads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/proto/plexus.pb.h"

namespace plexus {

enum class DType : int {
  kF32 = 1,
  kF64 = 2,
  kI32 = 3,
  kI64 = 4,
  kBF16 = 5,
  kF16 = 6,
  kI8 = 7,
  kU8 = 8,
  kBool = 9,
  // The other whole-byte dtypes of JAX (numpy's names, ml_dtypes' for the
  // 8-bit floats). Sub-byte ones (int4, float4_e2m1fn, ...) have no DType.
  kI16 = 10,
  kU16 = 11,
  kU32 = 12,
  kU64 = 13,
  kC64 = 14,
  kC128 = 15,
  kF8E5M2 = 16,
  kF8E4M3FN = 17,
  kF8E4M3B11FNUZ = 18,
  kF8E5M2FNUZ = 19,
  kF8E4M3FNUZ = 20,
  kF8E4M3 = 21,
  kF8E3M4 = 22,
  kF8E8M0FNU = 23,
};
inline constexpr int kMaxDType = 23;

// float32, float64, int32, int64: the dtypes built-in arithmetic kernels
// compute in. Every dtype moves, is stored and runs in XLA programs.
bool IsArithmeticDType(DType dtype);
// Whether partial sums of `dtype` can be added (AccumulateInto): every
// dtype but the 8-bit floats, which XLA programs compute in but Plexus does
// not add on the host.
bool CanAccumulate(DType dtype);

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "float32", "int64", ...
absl::StatusOr<DType> ParseDType(const std::string& name);

using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);  // "[8, 4]"

struct TensorSpec {
  DType dtype = DType::kF32;
  Shape shape;

  int64_t num_elements() const { return NumElements(shape); }
  int64_t byte_size() const { return num_elements() * DTypeSize(dtype); }
  std::string ToString() const;  // "float32[8, 4]"
  bool operator==(const TensorSpec& o) const {
    return dtype == o.dtype && shape == o.shape;
  }
  bool operator!=(const TensorSpec& o) const { return !(*this == o); }
};

// Layout of a logical array over the N devices of a slice:
//  - replicated: a full copy on each device;
//  - split(a): an even split along axis a (shard i holds rows
//    [i*len/N, (i+1)*len/N) of that axis);
//  - partial: each device holds an addend of the global shape and the value
//    is their sum (what a data-parallel gradient is before its all-reduce);
//  - mesh: a jax.sharding.PartitionSpec over a named mesh of several axes.
//    The slice's virtual devices are the mesh's points in row-major order;
//    array dimension d is split over the mesh axes dims[d] (major first, as
//    in P(("data", "fsdp"))), and the mesh axes no dimension names hold
//    replicas. Device i holds one block (BlockOf): per dimension, block
//    number c (the mixed-radix number of i's coordinates along dims[d]) of
//    len / (product of those axes' sizes). Mesh() gives split or replicated
//    when the spec is one of those, so a 1-D layout has one form.
struct Sharding {
  enum class Kind { kReplicated, kSplit, kPartial, kMesh };
  Kind kind = Kind::kReplicated;
  int axis = 0;
  // kMesh only.
  std::vector<int32_t> mesh;               // axis sizes
  std::vector<std::string> axis_names;     // for messages; not compared
  std::vector<std::vector<int32_t>> dims;  // per array dimension

  static Sharding Replicated() { return {}; }
  static Sharding Split(int axis) { return {Kind::kSplit, axis}; }
  static Sharding Partial() { return {Kind::kPartial, 0}; }
  static Sharding Mesh(std::vector<int32_t> mesh,
                       std::vector<std::string> axis_names,
                       std::vector<std::vector<int32_t>> dims);
  bool is_split() const { return kind == Kind::kSplit; }
  bool is_partial() const { return kind == Kind::kPartial; }
  bool is_replicated() const { return kind == Kind::kReplicated; }
  bool is_mesh() const { return kind == Kind::kMesh; }
  // "replicated", "split(0)", "partial", "P(('data', 'fsdp'), None) over
  // {data: 2, fsdp: 2, tensor: 2}"
  std::string ToString() const;
  bool operator==(const Sharding& o) const {
    if (kind != o.kind) return false;
    if (kind == Kind::kSplit) return axis == o.axis;
    if (kind == Kind::kMesh) return mesh == o.mesh && dims == o.dims;
    return true;
  }
  bool operator!=(const Sharding& o) const { return !(*this == o); }
};

// A mesh's axes and sizes, "{data: 2, model: 4}"; an axis without a name
// (past `axis_names`) is "axis<i>", as MeshAxisName says.
std::string MeshAxisName(const std::vector<std::string>& axis_names, int32_t a);
std::string MeshToString(const std::vector<int32_t>& mesh,
                         const std::vector<std::string>& axis_names);

// OK if `sharding` is well formed for an array of `rank` dimensions (a mesh
// one: axis sizes of at least 1, each axis named by at most one dimension,
// one entry per dimension); otherwise an error saying what is wrong.
absl::Status ValidateSharding(const Sharding& sharding, size_t rank);

// A box of an N-dimensional array: rows [start[d], start[d] + extent[d]) of
// each dimension d.
struct Box {
  Shape start;
  Shape extent;
};

// A program argument: global spec plus its layout over the slice.
struct ArgSpec {
  TensorSpec global;
  Sharding sharding;

  // The shape each device holds, or an error naming the axis that does not
  // divide evenly (or the mesh that is not the slice's size).
  absl::StatusOr<TensorSpec> Local(int num_shards) const;
  // The box of the global array that device `device` of `num_shards` holds
  // (the whole array for replicated and partial values). The one rule that
  // puts, fetches, routing and programs follow; Local() is its extent.
  absl::StatusOr<Box> BlockOf(int num_shards, int device) const;
  std::string ToString() const;  // "float32[8, 4] split(0)"
  bool operator==(const ArgSpec& o) const {
    return global == o.global && sharding == o.sharding;
  }
};

// Whether a value laid out as `from` can be an input declared `to`: the
// same global spec, and the same sharding or two that are not partial (the
// runtime moves each block of `to` from the blocks of `from` that hold it).
bool CanRelayout(const ArgSpec& from, const ArgSpec& to);

using AttrValue =
    std::variant<int64_t, double, std::string, std::vector<int64_t>>;
using Attrs = std::map<std::string, AttrValue>;

// OK if the spec's byte size is representable (at most 2^50 elements);
// otherwise an error naming the shape. Every spec from a user passes here.
absl::Status ValidateSpec(const TensorSpec& spec);

// Copies `len` rows along `axis` — rows [src_off, src_off + len) of the
// row-major array `src` (shape `src_shape`) to rows [dst_off, ...) of `dst`
// (shape `dst_shape`); the two shapes differ only along `axis`. How shards
// are cut from and assembled into arrays split along an axis. Checks every
// bound first (the shapes against each other and against `src_bytes` and
// `dst_bytes`, the rows against the shapes) and copies nothing if one
// fails: an Internal error naming the copy.
absl::Status CopyRows(const void* src, size_t src_bytes, const Shape& src_shape,
                      void* dst, size_t dst_bytes, const Shape& dst_shape,
                      int axis, int64_t src_off, int64_t dst_off, int64_t len,
                      size_t elem_size);

// Copies the box `extent` at `src_start` of the row-major array `src`
// (shape `src_shape`) to `dst_start` of `dst` (shape `dst_shape`), one
// memcpy per contiguous run. The ranks must agree. Checks every bound first
// (against the shapes and `src_bytes`, `dst_bytes`) and copies nothing if
// one fails: an Internal error naming the copy. How blocks of PartitionSpec
// layouts are cut from and assembled into arrays.
absl::Status CopyBox(const void* src, size_t src_bytes, const Shape& src_shape,
                     const Shape& src_start, void* dst, size_t dst_bytes,
                     const Shape& dst_shape, const Shape& dst_start,
                     const Shape& extent, size_t elem_size);

// acc[i] += in[i] for n elements of `dtype` (partial sums, all-reduce).
// bfloat16 and float16 add in float32 and round to nearest even; bool is
// logical or; unsigned integers wrap. Only for CanAccumulate(dtype): for
// the others it leaves `acc` as it is.
void AccumulateInto(DType dtype, void* acc, const void* in, int64_t n);

// bfloat16 <-> float32 (round to nearest even; NaN stays NaN).
float Bfloat16ToFloat(uint16_t bits);
uint16_t FloatToBfloat16(float f);
// IEEE binary16 (float16) <-> float32, the same way; in software, since
// clang has no _Float16 on x86-64 before version 15.
float Float16ToFloat(uint16_t bits);
uint16_t FloatToFloat16(float f);

// --- proto conversion -----------------------------------------------------
proto::TensorSpec ToProto(const TensorSpec& spec);
absl::StatusOr<TensorSpec> FromProto(const proto::TensorSpec& spec);
proto::Sharding ToProto(const Sharding& sharding);
Sharding FromProto(const proto::Sharding& sharding);
proto::ArgDef ToProto(const ArgSpec& arg);
absl::StatusOr<ArgSpec> FromProto(const proto::ArgDef& arg);
void AttrsToProto(const Attrs& attrs,
                  google::protobuf::Map<std::string, proto::AttrValue>* out);
Attrs AttrsFromProto(
    const google::protobuf::Map<std::string, proto::AttrValue>& attrs);

}  // namespace plexus

#include "plexus/common/types.h"

#include <algorithm>
#include <complex>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/common/names.h"

namespace plexus {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;        // numpy's (ml_dtypes' for bfloat16 and float8_*)
  const char* short_name;  // "f32", or null
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "float32", "f32", 4},
    {DType::kF64, "float64", "f64", 8},
    {DType::kI32, "int32", "i32", 4},
    {DType::kI64, "int64", "i64", 8},
    {DType::kBF16, "bfloat16", "bf16", 2},
    {DType::kF16, "float16", "f16", 2},
    {DType::kI8, "int8", "i8", 1},
    {DType::kU8, "uint8", "u8", 1},
    {DType::kBool, "bool", nullptr, 1},
    {DType::kI16, "int16", "i16", 2},
    {DType::kU16, "uint16", "u16", 2},
    {DType::kU32, "uint32", "u32", 4},
    {DType::kU64, "uint64", "u64", 8},
    {DType::kC64, "complex64", "c64", 8},
    {DType::kC128, "complex128", "c128", 16},
    {DType::kF8E5M2, "float8_e5m2", nullptr, 1},
    {DType::kF8E4M3FN, "float8_e4m3fn", nullptr, 1},
    {DType::kF8E4M3B11FNUZ, "float8_e4m3b11fnuz", nullptr, 1},
    {DType::kF8E5M2FNUZ, "float8_e5m2fnuz", nullptr, 1},
    {DType::kF8E4M3FNUZ, "float8_e4m3fnuz", nullptr, 1},
    {DType::kF8E4M3, "float8_e4m3", nullptr, 1},
    {DType::kF8E3M4, "float8_e3m4", nullptr, 1},
    {DType::kF8E8M0FNU, "float8_e8m0fnu", nullptr, 1},
};
static_assert(sizeof(kDTypes) / sizeof(kDTypes[0]) == kMaxDType,
              "one row per DType, in code order");

const DTypeInfo* InfoOf(DType dtype) {
  const int code = static_cast<int>(dtype);
  if (code < 1 || code > kMaxDType) return nullptr;
  return &kDTypes[code - 1];
}

}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeInfo* info = InfoOf(dtype);
  return info == nullptr ? 0 : info->size;
}

const char* DTypeName(DType dtype) {
  const DTypeInfo* info = InfoOf(dtype);
  return info == nullptr ? "invalid" : info->name;
}

bool IsArithmeticDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kI32 ||
         dtype == DType::kI64;
}

bool CanAccumulate(DType dtype) {
  const int code = static_cast<int>(dtype);
  return code >= 1 && code < static_cast<int>(DType::kF8E5M2);
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name ||
        (info.short_name != nullptr && name == info.short_name)) {
      return info.dtype;
    }
  }
  std::string supported;
  for (const DTypeInfo& info : kDTypes) {
    absl::StrAppend(&supported, supported.empty() ? "" : ", ", info.name);
  }
  static const char* const kSubByte[] = {
      "int4", "uint4", "int2", "uint2", "int1", "uint1", "float4_e2m1fn"};
  for (const char* sub : kSubByte) {
    if (name == sub) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype '", name,
          "' has elements smaller than a byte; Plexus moves whole-byte "
          "dtypes only (cast to int8, uint8 or a wider type)"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported dtype '", name, "' (supported: ", supported, ")"));
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string TensorSpec::ToString() const {
  return absl::StrCat(DTypeName(dtype), ShapeString(shape));
}

Sharding Sharding::Mesh(std::vector<int32_t> mesh,
                        std::vector<std::string> axis_names,
                        std::vector<std::vector<int32_t>> dims) {
  // Axes of size 1 split nothing: dropped, so that equal layouts compare
  // equal and reduce to the 1-D forms below.
  int split_dim = -1, named = 0;
  bool one_dim = true;
  for (size_t d = 0; d < dims.size(); ++d) {
    std::vector<int32_t> kept;
    for (int32_t a : dims[d]) {
      if (a < 0 || a >= static_cast<int32_t>(mesh.size()) || mesh[a] != 1) {
        kept.push_back(a);
      }
    }
    dims[d] = std::move(kept);
    if (dims[d].empty()) continue;
    named += static_cast<int>(dims[d].size());
    if (split_dim >= 0) one_dim = false;
    split_dim = static_cast<int>(d);
  }
  if (named == 0) return Replicated();
  // One dimension over every axis larger than 1, in mesh order: split.
  if (one_dim) {
    std::vector<int32_t> all;
    for (size_t a = 0; a < mesh.size(); ++a) {
      if (mesh[a] != 1) all.push_back(static_cast<int32_t>(a));
    }
    if (dims[split_dim] == all) return Split(split_dim);
  }
  Sharding s;
  s.kind = Kind::kMesh;
  s.mesh = std::move(mesh);
  s.axis_names = std::move(axis_names);
  s.dims = std::move(dims);
  return s;
}

std::string MeshAxisName(const std::vector<std::string>& axis_names,
                         int32_t a) {
  return a >= 0 && static_cast<size_t>(a) < axis_names.size()
             ? axis_names[a]
             : absl::StrCat("axis", a);
}

std::string MeshToString(const std::vector<int32_t>& mesh,
                         const std::vector<std::string>& axis_names) {
  std::vector<std::string> sizes;
  for (size_t a = 0; a < mesh.size(); ++a) {
    sizes.push_back(absl::StrCat(
        MeshAxisName(axis_names, static_cast<int32_t>(a)), ": ", mesh[a]));
  }
  return absl::StrCat("{", absl::StrJoin(sizes, ", "), "}");
}

std::string Sharding::ToString() const {
  if (is_split()) return absl::StrCat("split(", axis, ")");
  if (!is_mesh()) return is_partial() ? "partial" : "replicated";
  auto name = [&](int32_t a) { return MeshAxisName(axis_names, a); };
  std::vector<std::string> entries;
  for (const auto& axes : dims) {
    if (axes.empty()) {
      entries.push_back("None");
    } else if (axes.size() == 1) {
      entries.push_back(absl::StrCat("'", name(axes[0]), "'"));
    } else {
      std::vector<std::string> names;
      for (int32_t a : axes) names.push_back(absl::StrCat("'", name(a), "'"));
      entries.push_back(absl::StrCat("(", absl::StrJoin(names, ", "), ")"));
    }
  }
  return absl::StrCat("P(", absl::StrJoin(entries, ", "), ") over ",
                      MeshToString(mesh, axis_names));
}

absl::Status ValidateSharding(const Sharding& s, size_t rank) {
  if (!s.is_mesh()) return absl::OkStatus();
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sharding over mesh [", absl::StrJoin(s.mesh, ", "), "] ", why));
  };
  if (s.mesh.empty() || s.mesh.size() > 16)
    return refuse("has no axes or over 16");
  // The names reach messages and logs (ToString): bounded as every name.
  if (s.axis_names.size() > s.mesh.size()) {
    return refuse(absl::StrCat("has ", s.mesh.size(), " axes but ",
                               s.axis_names.size(), " axis names"));
  }
  for (const std::string& name : s.axis_names) {
    if (absl::Status st = CheckName("mesh axis name", name); !st.ok()) {
      return st;
    }
  }
  int64_t devices = 1;
  for (int32_t m : s.mesh) {
    if (m < 1) return refuse("has an axis smaller than 1");
    devices *= m;
    if (devices > (int64_t{1} << 20)) return refuse("has over 2^20 devices");
  }
  if (s.dims.size() != rank) {
    return refuse(absl::StrCat("gives ", s.dims.size(),
                               " dimensions, but the array has ", rank));
  }
  std::vector<bool> used(s.mesh.size(), false);
  for (const auto& axes : s.dims) {
    for (int32_t a : axes) {
      if (a < 0 || static_cast<size_t>(a) >= s.mesh.size()) {
        return refuse(absl::StrCat("has no axis ", a));
      }
      if (used[a]) return refuse(absl::StrCat("names axis ", a, " twice"));
      used[a] = true;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorSpec> ArgSpec::Local(int num_shards) const {
  if (sharding.is_replicated() || sharding.is_partial()) return global;
  if (sharding.is_mesh()) {
    if (absl::Status s = ValidateSharding(sharding, global.shape.size());
        !s.ok()) {
      return s;
    }
    int64_t devices = 1;
    for (int32_t m : sharding.mesh) devices *= m;
    if (devices != num_shards) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding ", sharding.ToString(), " is over ", devices,
                       " devices, but the slice has ", num_shards));
    }
    TensorSpec local = global;
    for (size_t d = 0; d < sharding.dims.size(); ++d) {
      int64_t parts = 1;
      for (int32_t a : sharding.dims[d]) parts *= sharding.mesh[a];
      if (global.shape[d] % parts != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dimension ", d, " of ", global.ToString(), " (length ",
            global.shape[d], ") does not split evenly into ", parts,
            " blocks of ", sharding.ToString()));
      }
      local.shape[d] /= parts;
    }
    return local;
  }
  int axis = sharding.axis;
  if (axis < 0 || axis >= static_cast<int>(global.shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding ", sharding.ToString(), " names axis ", axis,
                     " but the array ", global.ToString(), " has ",
                     global.shape.size(), " axes"));
  }
  if (num_shards <= 0 || global.shape[axis] % num_shards != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("axis ", axis, " of ", global.ToString(), " (length ",
                     global.shape[axis], ") does not split evenly over ",
                     num_shards, " devices"));
  }
  TensorSpec local = global;
  local.shape[axis] /= num_shards;
  return local;
}

absl::StatusOr<Box> ArgSpec::BlockOf(int num_shards, int device) const {
  auto local = Local(num_shards);
  if (!local.ok()) return local.status();
  if (device < 0 || device >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", device, " is not one of the slice's ", num_shards));
  }
  Box box{Shape(global.shape.size(), 0), local->shape};
  if (sharding.is_split()) {
    box.start[sharding.axis] = device * local->shape[sharding.axis];
  } else if (sharding.is_mesh()) {
    // Row-major coordinates of `device` over the mesh.
    std::vector<int64_t> coord(sharding.mesh.size());
    int64_t rest = device;
    for (size_t a = sharding.mesh.size(); a-- > 0;) {
      coord[a] = rest % sharding.mesh[a];
      rest /= sharding.mesh[a];
    }
    for (size_t d = 0; d < sharding.dims.size(); ++d) {
      int64_t block = 0;
      for (int32_t a : sharding.dims[d]) {
        block = block * sharding.mesh[a] + coord[a];
      }
      box.start[d] = block * local->shape[d];
    }
  }
  return box;
}

bool CanRelayout(const ArgSpec& from, const ArgSpec& to) {
  if (from.global != to.global) return false;
  if (from.sharding == to.sharding) return true;
  return !from.sharding.is_partial() && !to.sharding.is_partial();
}

std::string ArgSpec::ToString() const {
  return absl::StrCat(global.ToString(), " ", sharding.ToString());
}

namespace {
template <typename T>
void AddInto(void* acc, const void* in, int64_t n) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}
}  // namespace

void AccumulateInto(DType dtype, void* acc, const void* in, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      return AddInto<float>(acc, in, n);
    case DType::kF64:
      return AddInto<double>(acc, in, n);
    case DType::kI32:
      return AddInto<int32_t>(acc, in, n);
    case DType::kI64:
      return AddInto<int64_t>(acc, in, n);
    case DType::kI8:
      return AddInto<int8_t>(acc, in, n);
    case DType::kU8:
      return AddInto<uint8_t>(acc, in, n);
    case DType::kI16:
      return AddInto<int16_t>(acc, in, n);
    case DType::kU16:
      return AddInto<uint16_t>(acc, in, n);
    case DType::kU32:
      return AddInto<uint32_t>(acc, in, n);
    case DType::kU64:
      return AddInto<uint64_t>(acc, in, n);
    case DType::kC64:
      return AddInto<std::complex<float>>(acc, in, n);
    case DType::kC128:
      return AddInto<std::complex<double>>(acc, in, n);
    case DType::kF16: {
      auto* a = static_cast<uint16_t*>(acc);
      const auto* b = static_cast<const uint16_t*>(in);
      for (int64_t i = 0; i < n; ++i) {
        a[i] = FloatToFloat16(Float16ToFloat(a[i]) + Float16ToFloat(b[i]));
      }
      return;
    }
    case DType::kBF16: {
      auto* a = static_cast<uint16_t*>(acc);
      const auto* b = static_cast<const uint16_t*>(in);
      for (int64_t i = 0; i < n; ++i) {
        a[i] = FloatToBfloat16(Bfloat16ToFloat(a[i]) + Bfloat16ToFloat(b[i]));
      }
      return;
    }
    case DType::kBool: {
      auto* a = static_cast<uint8_t*>(acc);
      const auto* b = static_cast<const uint8_t*>(in);
      for (int64_t i = 0; i < n; ++i) a[i] = (a[i] | b[i]) != 0;
      return;
    }
    default:  // !CanAccumulate(dtype): refused before any data moves
      return;
  }
}

float Bfloat16ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

uint16_t FloatToBfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  }
  // Round to nearest, ties to even.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t wide;
  if (exponent == 0x1fu) {  // infinity or NaN
    wide = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    wide = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // zero
    wide = sign;
  } else {  // subnormal, mantissa * 2^-24: normalise
    uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    wide = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

uint16_t FloatToFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  uint32_t half;
  if (bits >= 0x47800000u) {  // 2^16 or more, infinity, NaN
    half = bits > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (bits < 0x38800000u) {  // below 2^-14: subnormal or zero
    // Adding 0.5 places the 10 kept bits at the bottom of the mantissa and
    // rounds them to nearest even in the float unit.
    constexpr uint32_t kMagicBits = 126u << 23;  // 0.5f
    float magic, sum;
    std::memcpy(&magic, &kMagicBits, sizeof(magic));
    std::memcpy(&sum, &bits, sizeof(sum));
    sum += magic;
    std::memcpy(&half, &sum, sizeof(half));
    half -= kMagicBits;
  } else {  // normal: rebias 127 -> 15, round to nearest even
    const uint32_t odd = (bits >> 13) & 1u;
    bits -= 112u << 23;
    bits += 0xfffu + odd;
    half = bits >> 13;  // a carry into exponent 31 is infinity
  }
  return static_cast<uint16_t>(sign | half);
}

absl::Status ValidateSpec(const TensorSpec& spec) {
  constexpr int64_t kMaxElements = int64_t{1} << 50;
  int64_t n = 1;
  for (int64_t d : spec.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "negative dimension ", d, " in ", ShapeString(spec.shape)));
    }
    if (d != 0 && n > kMaxElements / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeString(spec.shape), " has more than 2^50 elements"));
    }
    n *= d;
  }
  return absl::OkStatus();
}

absl::Status CopyRows(const void* src, size_t src_bytes, const Shape& src_shape,
                      void* dst, size_t dst_bytes, const Shape& dst_shape,
                      int axis, int64_t src_off, int64_t dst_off, int64_t len,
                      size_t elem_size) {
  auto refuse = [&](absl::string_view why) {
    return absl::InternalError(absl::StrCat(
        "copy of rows [", src_off, ", +", len, ") along axis ", axis, " of [",
        absl::StrJoin(src_shape, ", "), "] (", src_bytes, " bytes) to row ",
        dst_off, " of [", absl::StrJoin(dst_shape, ", "), "] (", dst_bytes,
        " bytes) refused: ", why));
  };
  const bool scalar = src_shape.empty() && dst_shape.empty();
  if (!scalar && (axis < 0 || static_cast<size_t>(axis) >= src_shape.size() ||
                  src_shape.size() != dst_shape.size())) {
    return refuse("the axis or the ranks do not match");
  }
  // Sizes from the shapes, in 128 bits: a shape from another process may
  // overflow 64.
  __int128 outer = 1, inner = static_cast<__int128>(elem_size);
  for (size_t i = 0; i < src_shape.size(); ++i) {
    if (src_shape[i] < 0 || dst_shape[i] < 0) return refuse("negative dim");
    if (static_cast<int>(i) == axis) continue;
    if (src_shape[i] != dst_shape[i]) {
      return refuse("the shapes differ off the axis");
    }
    (static_cast<int>(i) < axis ? outer : inner) *= src_shape[i];
    if (outer * inner > (__int128{1} << 62)) return refuse("too large");
  }
  const int64_t src_rows = scalar ? 1 : src_shape[axis];
  const int64_t dst_rows = scalar ? 1 : dst_shape[axis];
  if (src_off < 0 || dst_off < 0 || len < 0 || src_off > src_rows - len ||
      dst_off > dst_rows - len) {
    return refuse("the rows are out of range");
  }
  if (outer * src_rows * inner > static_cast<__int128>(src_bytes) ||
      outer * dst_rows * inner > static_cast<__int128>(dst_bytes)) {
    return refuse("a buffer is smaller than its shape");
  }
  const int64_t row_outer = static_cast<int64_t>(outer);
  const int64_t row_bytes = static_cast<int64_t>(inner);
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int64_t o = 0; o < row_outer; ++o) {
    std::memcpy(d + (o * dst_rows + dst_off) * row_bytes,
                s + (o * src_rows + src_off) * row_bytes, len * row_bytes);
  }
  return absl::OkStatus();
}

absl::Status CopyBox(const void* src, size_t src_bytes, const Shape& src_shape,
                     const Shape& src_start, void* dst, size_t dst_bytes,
                     const Shape& dst_shape, const Shape& dst_start,
                     const Shape& extent, size_t elem_size) {
  auto refuse = [&](absl::string_view why) {
    return absl::InternalError(
        absl::StrCat("copy of box [", absl::StrJoin(extent, ", "), "] at [",
                     absl::StrJoin(src_start, ", "), "] of [",
                     absl::StrJoin(src_shape, ", "), "] (", src_bytes,
                     " bytes) to [", absl::StrJoin(dst_start, ", "), "] of [",
                     absl::StrJoin(dst_shape, ", "), "] (", dst_bytes,
                     " bytes) refused: ", why));
  };
  const size_t rank = extent.size();
  if (src_shape.size() != rank || dst_shape.size() != rank ||
      src_start.size() != rank || dst_start.size() != rank || rank > 64) {
    return refuse("the ranks do not match");
  }
  // Sizes in 128 bits: shapes from another process may overflow 64.
  __int128 src_n = elem_size, dst_n = elem_size;
  bool empty = false;
  for (size_t d = 0; d < rank; ++d) {
    if (src_shape[d] < 0 || dst_shape[d] < 0 || extent[d] < 0 ||
        src_start[d] < 0 || dst_start[d] < 0) {
      return refuse("a negative size or start");
    }
    if (src_start[d] > src_shape[d] - extent[d] ||
        dst_start[d] > dst_shape[d] - extent[d]) {
      return refuse("the box is out of range");
    }
    src_n *= src_shape[d];
    dst_n *= dst_shape[d];
    if (src_n > (__int128{1} << 62) || dst_n > (__int128{1} << 62)) {
      return refuse("too large");
    }
    empty |= extent[d] == 0;
  }
  if (src_n > static_cast<__int128>(src_bytes) ||
      dst_n > static_cast<__int128>(dst_bytes)) {
    return refuse("a buffer is smaller than its shape");
  }
  if (empty) return absl::OkStatus();
  // Byte strides, and the run: the innermost dimensions the box covers
  // whole in both arrays, plus the next one, are one memcpy.
  std::vector<int64_t> src_stride(rank), dst_stride(rank);
  int64_t ss = static_cast<int64_t>(elem_size), ds = ss;
  for (size_t d = rank; d-- > 0;) {
    src_stride[d] = ss;
    dst_stride[d] = ds;
    ss *= src_shape[d];
    ds *= dst_shape[d];
  }
  size_t outer = rank;
  while (outer > 0 && extent[outer - 1] == src_shape[outer - 1] &&
         extent[outer - 1] == dst_shape[outer - 1]) {
    --outer;
  }
  int64_t run = static_cast<int64_t>(elem_size);
  for (size_t d = outer; d < rank; ++d) run *= extent[d];
  if (outer > 0) {
    --outer;
    run *= extent[outer];
  }
  const char* s = static_cast<const char*>(src);
  char* t = static_cast<char*>(dst);
  for (size_t d = 0; d < rank; ++d) {
    s += src_start[d] * src_stride[d];
    t += dst_start[d] * dst_stride[d];
  }
  // An odometer over the dimensions outside the run.
  std::vector<int64_t> at(outer, 0);
  while (true) {
    std::memcpy(t, s, run);
    size_t d = outer;
    while (d > 0) {
      --d;
      if (++at[d] < extent[d]) {
        s += src_stride[d];
        t += dst_stride[d];
        break;
      }
      s -= (extent[d] - 1) * src_stride[d];
      t -= (extent[d] - 1) * dst_stride[d];
      at[d] = 0;
      if (d == 0) return absl::OkStatus();
    }
    if (outer == 0) return absl::OkStatus();
  }
}

proto::TensorSpec ToProto(const TensorSpec& spec) {
  proto::TensorSpec p;
  p.set_dtype(static_cast<proto::DType>(spec.dtype));
  for (int64_t d : spec.shape) p.add_shape(d);
  return p;
}

absl::StatusOr<TensorSpec> FromProto(const proto::TensorSpec& p) {
  if (p.dtype() < proto::F32 || p.dtype() > kMaxDType) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid dtype code ", p.dtype()));
  }
  TensorSpec spec;
  spec.dtype = static_cast<DType>(p.dtype());
  spec.shape.reserve(p.shape_size());
  for (int64_t d : p.shape()) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", d, " in shape"));
    }
    spec.shape.push_back(d);
  }
  if (absl::Status s = ValidateSpec(spec); !s.ok()) return s;
  return spec;
}

proto::Sharding ToProto(const Sharding& s) {
  proto::Sharding p;
  p.set_kind(s.is_split()     ? proto::Sharding::SPLIT
             : s.is_partial() ? proto::Sharding::PARTIAL
             : s.is_mesh()    ? proto::Sharding::MESH
                              : proto::Sharding::REPLICATED);
  p.set_axis(s.axis);
  if (s.is_mesh()) {
    for (int32_t m : s.mesh) p.add_mesh(m);
    for (const auto& name : s.axis_names) p.add_mesh_axis_names(name);
    for (const auto& axes : s.dims) {
      auto* list = p.add_dim_axes();
      for (int32_t a : axes) list->add_values(a);
    }
  }
  return p;
}

Sharding FromProto(const proto::Sharding& p) {
  switch (p.kind()) {
    case proto::Sharding::SPLIT:
      return Sharding::Split(p.axis());
    case proto::Sharding::PARTIAL:
      return Sharding::Partial();
    case proto::Sharding::MESH: {
      // As sent: ValidateSharding (FromProto of the ArgDef) checks it.
      Sharding s;
      s.kind = Sharding::Kind::kMesh;
      s.mesh.assign(p.mesh().begin(), p.mesh().end());
      s.axis_names.assign(p.mesh_axis_names().begin(),
                          p.mesh_axis_names().end());
      for (const auto& list : p.dim_axes()) {
        std::vector<int32_t> axes;
        for (int64_t a : list.values()) {
          axes.push_back(a < 0 || a > 64 ? -1 : static_cast<int32_t>(a));
        }
        s.dims.push_back(std::move(axes));
      }
      return s;
    }
    default:
      return Sharding::Replicated();
  }
}

proto::ArgDef ToProto(const ArgSpec& arg) {
  proto::ArgDef p;
  *p.mutable_global() = ToProto(arg.global);
  *p.mutable_sharding() = ToProto(arg.sharding);
  return p;
}

absl::StatusOr<ArgSpec> FromProto(const proto::ArgDef& p) {
  ArgSpec arg;
  auto spec = FromProto(p.global());
  if (!spec.ok()) return spec.status();
  arg.global = *std::move(spec);
  arg.sharding = FromProto(p.sharding());
  if (absl::Status s = ValidateSharding(arg.sharding, arg.global.shape.size());
      !s.ok()) {
    return s;
  }
  if (arg.sharding.is_mesh()) {  // one form per layout, as Mesh() gives
    arg.sharding = Sharding::Mesh(std::move(arg.sharding.mesh),
                                  std::move(arg.sharding.axis_names),
                                  std::move(arg.sharding.dims));
  }
  return arg;
}

void AttrsToProto(const Attrs& attrs,
                  google::protobuf::Map<std::string, proto::AttrValue>* out) {
  for (const auto& [k, v] : attrs) {
    proto::AttrValue& pv = (*out)[k];
    if (auto* i = std::get_if<int64_t>(&v)) pv.set_i(*i);
    if (auto* f = std::get_if<double>(&v)) pv.set_f(*f);
    if (auto* s = std::get_if<std::string>(&v)) pv.set_s(*s);
    if (auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      for (int64_t x : *l) pv.mutable_ints()->add_values(x);
    }
  }
}

Attrs AttrsFromProto(
    const google::protobuf::Map<std::string, proto::AttrValue>& attrs) {
  Attrs out;
  for (const auto& [k, v] : attrs) {
    switch (v.value_case()) {
      case proto::AttrValue::kI:
        out[k] = v.i();
        break;
      case proto::AttrValue::kF:
        out[k] = v.f();
        break;
      case proto::AttrValue::kS:
        out[k] = v.s();
        break;
      case proto::AttrValue::kInts:
        out[k] = std::vector<int64_t>(v.ints().values().begin(),
                                      v.ints().values().end());
        break;
      default:
        break;
    }
  }
  return out;
}

}  // namespace plexus

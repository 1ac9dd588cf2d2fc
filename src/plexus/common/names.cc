#include "plexus/common/names.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace plexus {
namespace {

constexpr size_t kShownBytes = 64;

}  // namespace

absl::Status CheckName(absl::string_view what, absl::string_view name) {
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", what, " is at most ", kMaxNameBytes,
                     " bytes; this one is ", name.size(), " (it begins '",
                     Abbreviated(name.substr(0, kShownBytes)), "')"));
  }
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("a ", what, " holds no control characters; '",
                       absl::CHexEscape(Abbreviated(name)), "' has byte ",
                       static_cast<int>(c)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckProgramStrings(const proto::ProgramDef& def) {
  if (absl::Status s = CheckName("program name", def.name()); !s.ok()) return s;
  auto check = [&](absl::string_view what, absl::string_view name) {
    absl::Status s = CheckName(what, name);
    if (s.ok()) return s;
    return absl::Status(
        s.code(), absl::StrCat("program '", def.name(), "': ", s.message()));
  };
  if (absl::Status s = check("kernel name", def.kernel()); !s.ok()) return s;
  for (const auto& [name, value] : def.attrs()) {
    if (absl::Status s = check("program attribute name", name); !s.ok()) {
      return s;
    }
    if (value.value_case() != proto::AttrValue::kS) continue;
    if (absl::Status s =
            check(absl::StrCat("string value (of attribute '", name, "')"),
                  value.s());
        !s.ok()) {
      return s;
    }
  }
  return check("platform name (of an XLA program)", def.xla().platform());
}

std::string Abbreviated(absl::string_view text) {
  if (text.size() <= kShownBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kShownBytes), "... (", text.size(),
                      " bytes)");
}

}  // namespace plexus

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

std::string Abbreviated(absl::string_view text) {
  if (text.size() <= kShownBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kShownBytes), "... (", text.size(),
                      " bytes)");
}

}  // namespace plexus

#include "plexus/common/argument_count.h"

#include "absl/strings/str_cat.h"

namespace plexus {

absl::Status CheckArgumentCount(absl::string_view program_name, size_t expected,
                                size_t given) {
  if (given == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("program '", program_name,
                                                 "' takes ", expected,
                                                 " arguments, got ", given));
}

}  // namespace plexus

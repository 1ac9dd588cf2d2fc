#include "plexus/common/donation.h"

#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace plexus {

absl::StatusOr<std::vector<int>> DonatedInputs(
    const proto::ProgramDef& def, const std::vector<ArgSpec>& inputs,
    const std::vector<ArgSpec>& outputs) {
  const auto& in = def.xla().donated_inputs();
  const auto& out = def.xla().donated_outputs();
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("program '", def.name(), "': donation: ", why));
  };
  if (in.size() != out.size()) {
    return bad(absl::StrCat(in.size(), " donated inputs but ", out.size(),
                            " outputs written over them"));
  }
  std::vector<int> donated;
  std::set<int> outs;
  for (int k = 0; k < in.size(); ++k) {
    const int i = in[k], o = out[k];
    if (i < 0 || i >= static_cast<int>(inputs.size())) {
      return bad(absl::StrCat("input ", i, " does not exist (", inputs.size(),
                              " inputs)"));
    }
    if (o < 0 || o >= static_cast<int>(outputs.size())) {
      return bad(absl::StrCat("output ", o, " does not exist (", outputs.size(),
                              " outputs)"));
    }
    if (std::find(donated.begin(), donated.end(), i) != donated.end() ||
        !outs.insert(o).second) {
      return bad(
          absl::StrCat("input ", i, " or output ", o, " is named twice"));
    }
    if (!(inputs[i] == outputs[o])) {
      return bad(absl::StrCat("input ", i, " is ", inputs[i].ToString(),
                              " but output ", o, ", written over it, is ",
                              outputs[o].ToString()));
    }
    donated.push_back(i);
  }
  return donated;
}

}  // namespace plexus

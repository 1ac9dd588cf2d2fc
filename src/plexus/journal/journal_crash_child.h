// What journal_crash_child appends as record `seq`, so that the crash test
// can check every replayed record is the one appended under its seq.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace plexus::journal {

inline uint16_t CrashRecordType(uint64_t seq) { return 1 + seq % 7; }
inline std::string CrashPayload(uint64_t seq) {
  return absl::StrCat("crash-record-", seq, "-", std::string(seq % 200, 'p'));
}

}  // namespace plexus::journal

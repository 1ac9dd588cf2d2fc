// The crash test's child (journal_crash_test.cc): opens the journal at
// argv[1], appends records whose type and payload are functions of their
// seq (journal_crash_child.h) as fast as the journal takes them, at most 256
// ahead of the durable seq, and writes each durable seq, as "<seq>\n", to
// descriptor 3 in order, until it is killed.
#include "plexus/journal/journal_crash_child.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "plexus/journal/journal.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: journal_crash_child PATH\n");
    return 2;
  }
  using plexus::journal::Journal;
  plexus::journal::JournalOptions options;
  options.path = argv[1];
  plexus::journal::Replay replay;
  absl::StatusOr<std::unique_ptr<Journal>> journal =
      Journal::Open(options, &replay);
  if (!journal.ok()) {
    std::fprintf(stderr, "%s\n", journal.status().ToString().c_str());
    return 1;
  }
  Journal& j = **journal;
  // The only appender: record n gets seq n.
  for (uint64_t n = j.last_seq() + 1;; ++n) {
    absl::StatusOr<uint64_t> seq = j.Append(plexus::journal::CrashRecordType(n),
                                            plexus::journal::CrashPayload(n));
    if (!seq.ok() || *seq != n) {
      std::fprintf(stderr, "append %llu: %s\n",
                   static_cast<unsigned long long>(n),
                   seq.status().ToString().c_str());
      return 1;
    }
    j.OnDurable(*seq, [seq = *seq](absl::Status s) {
      if (!s.ok()) _exit(1);
      std::string line = absl::StrCat(seq, "\n");
      if (write(3, line.data(), line.size()) !=
          static_cast<ssize_t>(line.size())) {
        _exit(1);
      }
    });
    if (*seq > 256) {
      absl::Status s = j.AwaitDurable(*seq - 256, absl::InfiniteFuture());
      if (!s.ok()) return 1;
    }
  }
}

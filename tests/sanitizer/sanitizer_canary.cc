// Proof that a sanitizer stage can fail: run with one planted bug's name,
// this program commits it; sanitizer_canary.cmake (a CTest test of the
// sanitizer builds) requires the sanitizer to stop it and to write its
// report where log_path says. Without an argument it does nothing wrong.
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"

namespace {

// Opaque to the optimiser, so that each bug happens at run time.
volatile int sink;

int HeapOverflow() {
  auto block = std::make_unique<char[]>(16);
  const int index = 16 + sink;  // one past the end
  return block[index];
}

int SignedOverflow() {
  int big = 0x7fffffff - sink;
  return big + 1;
}

int DataRace() {
  int shared = 0;
  std::thread writer([&] { shared = 1; });
  const int seen = shared;  // unsynchronised with the write
  writer.join();
  return seen;
}

// Two mutexes taken in both orders, one after the other: no deadlock
// happens, but abseil's deadlock detection (on in Debian's abseil, which
// is built without NDEBUG) sees the cycle and aborts.
int LockOrderInversion() {
  absl::Mutex first, second;
  {
    absl::MutexLock a(&first);
    absl::MutexLock b(&second);
  }
  absl::MutexLock b(&second);
  absl::MutexLock a(&first);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 0;
  const char* bug = argv[1];
  int result = 0;
  if (std::strcmp(bug, "heap-overflow") == 0) {
    result = HeapOverflow();
  } else if (std::strcmp(bug, "signed-overflow") == 0) {
    result = SignedOverflow();
  } else if (std::strcmp(bug, "data-race") == 0) {
    result = DataRace();
  } else if (std::strcmp(bug, "lock-order-inversion") == 0) {
    result = LockOrderInversion();
  } else {
    std::fprintf(stderr, "unknown bug %s\n", bug);
    return 2;
  }
  std::printf("%s went unnoticed (%d)\n", bug, result);
  return 0;
}

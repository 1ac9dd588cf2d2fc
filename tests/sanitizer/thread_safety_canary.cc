// Proof that the thread-safety build can fail (make test-tsa): each PLANT
// breaks one rule -Wthread-safety -Wthread-safety-beta -Werror enforces,
// and thread_safety_canary.cmake requires every one of them to fail to
// compile with its own diagnostic, and the file without a plant to compile.
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

class Canary {
 public:
  void Touch() {
#if PLANT == 1  // a guarded field written without its mutex
    value_ = 1;
#elif PLANT == 2  // a *Locked helper called without the mutex
    BumpLocked();
#elif PLANT == 3  // two mutexes taken against their declared order
    absl::MutexLock second(&second_);
    absl::MutexLock first(&mu_);
#else
    absl::MutexLock first(&mu_);
    absl::MutexLock second(&second_);
    BumpLocked();
#endif
  }

 private:
  void BumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++value_; }

  absl::Mutex mu_;
  absl::Mutex second_ ABSL_ACQUIRED_AFTER(mu_);
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

void UseCanary() {
  Canary canary;
  canary.Touch();
}

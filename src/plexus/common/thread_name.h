// Names for the threads of Plexus processes, as `top -H`, /proc/PID/task/*/comm
// and debuggers show them.
#pragma once

#include <pthread.h>

namespace plexus {

// Names the calling thread; at most 15 characters.
inline void SetThreadName(const char* name) {
  pthread_setname_np(pthread_self(), name);
}

}  // namespace plexus

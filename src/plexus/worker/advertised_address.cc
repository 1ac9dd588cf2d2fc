#include "plexus/worker/advertised_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace plexus {
namespace {

// The local address this host uses to reach `server` ("host:port"): a UDP
// socket connected there (nothing is sent) shows the source address the
// kernel's routes pick. Empty if it cannot tell.
std::string LocalAddressTowards(const std::string& server) {
  const size_t colon = server.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = server.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), server.substr(colon + 1).c_str(), &hints,
                  &found) != 0) {
    return "";
  }
  std::string local;
  for (addrinfo* ai = found; ai != nullptr && local.empty(); ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage me{};
    socklen_t len = sizeof(me);
    char text[INET6_ADDRSTRLEN] = {0};
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
      if (me.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&me)->sin_addr, text,
                  sizeof(text));
        local = text;
      } else if (me.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&me)->sin6_addr,
                  text, sizeof(text));
        local = absl::StrCat("[", text, "]");
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return local;
}

}  // namespace

std::string AdvertisedDataAddress(const std::string& bound,
                                  const std::string& advertise_host,
                                  const std::string& server) {
  const size_t colon = bound.rfind(':');
  const std::string host = bound.substr(0, colon);
  const std::string port = bound.substr(colon + 1);
  std::string advertised = advertise_host;
  if (advertised.empty() && host != "0.0.0.0" && host != "[::]") return bound;
  if (advertised.empty()) advertised = LocalAddressTowards(server);
  if (advertised.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    advertised = name;
  }
  // A bare IPv6 address needs its brackets before a port.
  if (advertised.front() != '[' &&
      std::count(advertised.begin(), advertised.end(), ':') > 1) {
    advertised = absl::StrCat("[", advertised, "]");
  }
  return absl::StrCat(advertised, ":", port);
}

}  // namespace plexus

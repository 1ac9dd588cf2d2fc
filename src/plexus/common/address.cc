#include "plexus/common/address.h"

#include <arpa/inet.h>

#include <cstring>

#include "absl/strings/ascii.h"

namespace plexus {

std::string HostOfAddress(absl::string_view address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close != absl::string_view::npos) {
      return std::string(address.substr(1, close - 1));
    }
  }
  const size_t colon = address.rfind(':');
  // More than one colon without brackets: a bare IPv6 address, no port.
  if (colon == absl::string_view::npos || address.find(':') != colon) {
    return std::string(address);
  }
  return std::string(address.substr(0, colon));
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::AsciiStrToLower(host) == "localhost") return true;
  const std::string text(host);
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
  }
  return false;
}

}  // namespace plexus

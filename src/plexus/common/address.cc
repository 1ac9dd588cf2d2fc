#include "plexus/common/address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

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

bool IsServerList(absl::string_view address) {
  return address.find(',') != absl::string_view::npos;
}

absl::StatusOr<std::string> ServerTarget(absl::string_view address) {
  if (!IsServerList(address)) return std::string(address);
  std::vector<std::string> entries;
  bool v4 = false, v6 = false;
  for (absl::string_view entry : absl::StrSplit(address, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const std::string host = HostOfAddress(entry);
    const size_t colon = entry.rfind(':');
    const bool has_port = host != entry && colon != absl::string_view::npos &&
                          colon + 1 < entry.size();
    in_addr a4;
    in6_addr a6;
    const bool is_v4 = inet_pton(AF_INET, host.c_str(), &a4) == 1;
    const bool is_v6 = !is_v4 && !entry.empty() && entry.front() == '[' &&
                       inet_pton(AF_INET6, host.c_str(), &a6) == 1;
    if (!has_port || !(is_v4 || is_v6)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server address list '", address, "': '", entry,
          "' is not an IP address and port; a list names each server by "
          "its address ('10.0.0.1:7070,10.0.0.2:7070'), and a name is "
          "given alone (one that resolves to the server that serves, such "
          "as a Kubernetes Service)"));
    }
    v4 |= is_v4;
    v6 |= is_v6;
    entries.emplace_back(entry);
  }
  if (v4 && v6) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address list '", address,
                     "' mixes IPv4 and IPv6 addresses: give one kind"));
  }
  return absl::StrCat(v4 ? "ipv4:" : "ipv6:", absl::StrJoin(entries, ","));
}

absl::Duration RetryCapFor(absl::string_view address, absl::Duration usual) {
  return IsServerList(address) ? std::min(usual, kServerListRetryCap) : usual;
}

}  // namespace plexus

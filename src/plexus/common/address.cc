#include "plexus/common/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

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

namespace {

// One entry of a server list as gRPC's ipv4:/ipv6: target takes it: an IP
// literal as it is, a name resolved ("host:port" or "[v6]:port").
absl::StatusOr<std::string> ListEntryAddress(absl::string_view address,
                                             absl::string_view entry,
                                             bool* v6) {
  const std::string host = HostOfAddress(entry);
  const size_t colon = entry.rfind(':');
  const bool has_port = host != entry && colon != absl::string_view::npos &&
                        colon + 1 < entry.size();
  if (!has_port || host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server address list '", address, "': '", entry,
        "' has no port; a list names each server by its address or name "
        "and port ('10.0.0.1:7070,10.0.0.2:7070')"));
  }
  const std::string port(entry.substr(colon + 1));
  in_addr a4;
  in6_addr a6;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    *v6 = false;
    return std::string(entry);
  }
  if (entry.front() == '[' && inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    *v6 = true;
    return std::string(entry);
  }
  // A name: its IPv4 address if it has one, else its IPv6 address.
  for (int family : {AF_INET, AF_INET6}) {
    addrinfo hints{};
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 ||
        found == nullptr) {
      continue;
    }
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        family == AF_INET
            ? static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr);
    const bool ok = inet_ntop(family, raw, text, sizeof(text)) != nullptr;
    freeaddrinfo(found);
    if (!ok) continue;
    *v6 = family == AF_INET6;
    return family == AF_INET ? absl::StrCat(text, ":", port)
                             : absl::StrCat("[", text, "]:", port);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "server address list '", address, "': '", entry,
      "' does not resolve to an address (a name of the list is resolved "
      "once, when the list is read)"));
}

}  // namespace

absl::StatusOr<std::string> ServerTarget(absl::string_view address) {
  if (!IsServerList(address)) return std::string(address);
  std::vector<std::string> entries;
  bool v4 = false, v6 = false;
  for (absl::string_view entry : absl::StrSplit(address, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    bool is_v6 = false;
    absl::StatusOr<std::string> resolved =
        ListEntryAddress(address, entry, &is_v6);
    if (!resolved.ok()) return resolved.status();
    v4 |= !is_v6;
    v6 |= is_v6;
    entries.push_back(*std::move(resolved));
  }
  if (v4 && v6) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address list '", address,
                     "' mixes IPv4 and IPv6 addresses: give one kind"));
  }
  return absl::StrCat(v4 ? "ipv4:" : "ipv6:", absl::StrJoin(entries, ","));
}

std::string ServerListAuthority(absl::string_view address) {
  if (!IsServerList(address)) return "";
  const absl::string_view first =
      absl::StripAsciiWhitespace(address.substr(0, address.find(',')));
  return std::string(first);
}

absl::Duration RetryCapFor(absl::string_view address, absl::Duration usual) {
  return IsServerList(address) ? std::min(usual, kServerListRetryCap) : usual;
}

}  // namespace plexus

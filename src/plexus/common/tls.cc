#include "plexus/common/tls.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "plexus/common/address.h"

namespace plexus {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the TLS ", what, " file ", path));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate and its key (--tls-cert and "
        "--tls-key)");
  }
  absl::StatusOr<std::string> cert = ReadPem(cert_file, "certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(key_file, "key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> SessionChannel(
    const std::string& address, const std::string& ca_file) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (IsServerList(address)) {
    // A server list: a primary that stops answering (stopped, or its host
    // cut off) ends the session within ~2 s, as a crash does, so the
    // session goes on with the standby that takes over.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    // A stopped primary's kernel still accepts the connection; its
    // handshake never comes. Given up after a second (gRPC's default is
    // 20 s), the next server of the list is tried.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    // While none answers, tried again every quarter second at most: the
    // standby listens at its lease's end (RetryCapFor).
    args.SetInt(
        GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
        static_cast<int>(absl::ToInt64Milliseconds(kServerListRetryCap)));
  }
  return ServerChannel(address, ca_file, std::move(args));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ServerChannel(
    const std::string& address, const std::string& ca_file,
    grpc::ChannelArguments args) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
      ChannelCredentialsFor(ca_file);
  if (!tls.ok()) return tls.status();
  absl::StatusOr<std::string> target = ServerTarget(address);
  if (!target.ok()) return target.status();
  // A list's target ("ipv4:a,b") is no name to check a certificate
  // against: its first entry is.
  const std::string authority = ServerListAuthority(address);
  if (!authority.empty()) {
    args.SetString(GRPC_ARG_DEFAULT_AUTHORITY, authority);
  }
  return grpc::CreateCustomChannel(*target, *tls, args);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const std::string& ca_file) {
  std::string path = ca_file;
  if (path.empty()) {
    if (const char* env = std::getenv(kTlsCaEnv)) path = env;
  }
  if (path.empty()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> ca = ReadPem(path, "CA");
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  return grpc::SslCredentials(options);
}

}  // namespace plexus

// TLS on the control plane, through gRPC's own credentials.
//
// The operator gives the server a certificate and its key (PEM files:
// plexus-server --tls-cert FILE --tls-key FILE). Everything that dials the
// server (workers, clients, the `plexus` command) then trusts the CA in
// the PEM file named by $PLEXUS_TLS_CA, or by --tls-ca FILE / tls_ca= where
// a command or call takes one (for a self-signed certificate, the
// certificate itself). The name dialled must be one the certificate names
// (its subjectAltName: an IP address or a DNS name).
//
// Without certificates the control plane is plain gRPC: on loopback that is
// the default; off loopback the cluster secret still authenticates every
// party, but a sniffer reads the control messages (docs/security.md).
//
// Thread-safe: functions only.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace plexus {

inline constexpr char kTlsCaEnv[] = "PLEXUS_TLS_CA";

// TLS with `cert_file` and `key_file` when both are given, plain text when
// neither is; InvalidArgument for one without the other, NotFound naming
// a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const std::string& cert_file, const std::string& key_file);

// TLS trusting the CA in `ca_file`, else in $PLEXUS_TLS_CA; plain text
// when neither names one. NotFound naming a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const std::string& ca_file = "");

// A channel to the server at `address` for one session (a client's, a
// worker's registration), with ChannelCredentialsFor(ca_file) and messages
// of up to 256 MiB. A channel of its own (a local subchannel pool) that
// tries again quickly (100 ms, backing off to 1 s): no back-off is
// inherited from an earlier attempt's connection, so a server that comes
// back is found within ~0.1 s to 1 s. `address` may be a server list
// (ServerTarget: a primary and its standbys); the channel then also pings
// every second, so a primary that stops answering ends the session within
// about two seconds, as a crash does.
absl::StatusOr<std::shared_ptr<grpc::Channel>> SessionChannel(
    const std::string& address, const std::string& ca_file);

// A channel to the server at `address` (one address or a server list:
// ServerTarget, checked against ServerListAuthority) with `args` and
// ChannelCredentialsFor(ca_file). SessionChannel's, and every one-shot
// call's (status, shutdown).
absl::StatusOr<std::shared_ptr<grpc::Channel>> ServerChannel(
    const std::string& address, const std::string& ca_file,
    grpc::ChannelArguments args = {});

}  // namespace plexus

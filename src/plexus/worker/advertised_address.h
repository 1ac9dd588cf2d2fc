// The data-plane address a worker registers with the server, which peers
// and clients connect to.
#pragma once

#include <string>

namespace plexus {

// `bound` ("HOST:PORT", as the TCP data plane bound it) with
// `advertise_host` for its host; with none, `bound` itself, unless it
// binds every interface (0.0.0.0, [::]): then the local address that
// reaches `server`, else the host name.
std::string AdvertisedDataAddress(const std::string& bound,
                                  const std::string& advertise_host,
                                  const std::string& server);

}  // namespace plexus

#include "plexus/web/web_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/util/json_util.h"
#include "plexus/common/address.h"
#include "plexus/common/logging.h"
#include "plexus/common/serial_executor.h"
#include "plexus/web/assets.h"
#include "plexus/web/metrics.h"
#include "plexus/web/viewer.h"

namespace plexus::web {

namespace {

// Only this server's files; Chart.js sets canvas styles inline.
constexpr char kSecurityPolicy[] =
    "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'";

// civetweb's form of `listen`: "127.0.0.1:0", "[::1]:0" (it takes
// numeric hosts only; "localhost" is the loopback address).
std::string CivetPorts(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return listen;
  std::string host = listen.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    return listen.substr(colon + 1);  // every IPv4 address
  }
  return absl::StrCat(host, ":", listen.substr(colon + 1));
}

int LogMessage(const mg_connection*, const char* message) {
  SPDLOG_WARN("web: {}", message);
  return 1;  // logged: civetweb writes nothing itself
}

// One connection to the listening socket at host:port (an IPv6 host
// without brackets), closed at once.
void WakeListener(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_storage to{};
  socklen_t size = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&to);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    inet_pton(AF_INET6, host.c_str(), &a->sin6_addr);
    size = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&to);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    inet_pton(AF_INET, host.c_str(), &a->sin_addr);
    size = sizeof(*a);
  }
  (void)connect(fd, reinterpret_cast<sockaddr*>(&to), size);
  close(fd);
}

int64_t UnixMillis(Clock* clock) { return absl::ToUnixMillis(clock->Now()); }

}  // namespace

struct WebServer::Impl {
  // Requests are answered here, on a thread of ours: civetweb's threads
  // have small stacks (an ASan build overflowed one writing /metrics).
  SerialExecutor answers{"plexus-web"};
  mg_context* ctx = nullptr;
  std::thread sampler;
  absl::Mutex mu;
  absl::CondVar wake;
  bool stop ABSL_GUARDED_BY(mu) = false;
};

WebServer::WebServer(const WebOptions& options, const ClusterSecret& secret,
                     StatusSource source)
    : options_(options),
      secret_(secret),
      source_(std::move(source)),
      history_(options.history_samples),
      impl_(std::make_unique<Impl>()) {}

absl::StatusOr<std::unique_ptr<WebServer>> WebServer::Start(
    const WebOptions& options, const ClusterSecret& secret,
    StatusSource source) {
  std::unique_ptr<WebServer> server(
      new WebServer(options, secret, std::move(source)));
  // The first sample, before anything is served: a page opened at once
  // has a point to plot (the sampler takes the next one a period later).
  const absl::Time first = options.clock->Now();
  server->TakeSample();
  static const unsigned initialized = mg_init_library(0);
  (void)initialized;
  const std::string ports = CivetPorts(options.listen);
  const std::string threads = absl::StrCat(std::max(1, options.threads));
  const char* config[] = {"listening_ports",
                          ports.c_str(),
                          "num_threads",
                          threads.c_str(),
                          "enable_keep_alive",
                          "yes",
                          "request_timeout_ms",
                          "10000",
                          nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = &LogMessage;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = server.get();
  init.configuration_options = config;
  char error_text[256] = {};
  unsigned error_code = 0;
  mg_error_data error{&error_code, error_text, sizeof(error_text)};
  server->impl_->ctx = mg_start2(&init, &error);
  if (server->impl_->ctx == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("the live page cannot listen on ", options.listen, ": ",
                     error_text[0] ? error_text : "civetweb did not start"));
  }
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(server->impl_->ctx, 4, bound);
  if (n < 1) {
    return absl::UnavailableError(absl::StrCat(
        "the live page did not report its port on ", options.listen));
  }
  const size_t colon = options.listen.rfind(':');
  std::string host = colon == std::string::npos
                         ? "127.0.0.1"
                         : options.listen.substr(0, colon);
  if (host.empty() || host == "*") host = "0.0.0.0";
  server->address_ = absl::StrCat(host, ":", bound[0].port);
  mg_set_request_handler(
      server->impl_->ctx, "/",
      [](mg_connection* conn, void* self) -> int {
        const mg_request_info* info = mg_get_request_info(conn);
        const char* auth = mg_get_header(conn, "Authorization");
        auto* server = static_cast<WebServer*>(self);
        Response r;
        absl::Notification answered;
        server->impl_->answers.Post([&] {
          r = server->Handle(info->request_method ? info->request_method : "",
                             info->local_uri ? info->local_uri : "",
                             info->query_string ? info->query_string : "",
                             auth ? auth : "");
          answered.Notify();
        });
        answered.WaitForNotification();
        mg_response_header_start(conn, r.code);
        mg_response_header_add(conn, "Content-Type", r.content_type.c_str(),
                               -1);
        const std::string length = absl::StrCat(r.body.size());
        mg_response_header_add(conn, "Content-Length", length.c_str(), -1);
        mg_response_header_add(conn, "Cache-Control", "no-store", -1);
        mg_response_header_add(conn, "X-Content-Type-Options", "nosniff", -1);
        mg_response_header_add(conn, "Content-Security-Policy", kSecurityPolicy,
                               -1);
        if (r.code == 401) {
          mg_response_header_add(conn, "WWW-Authenticate",
                                 "Bearer realm=\"plexus\"", -1);
        }
        mg_response_header_send(conn);
        if (std::string(info->request_method) != "HEAD") {
          mg_write(conn, r.body.data(), r.body.size());
        }
        return r.code;
      },
      server.get());
  server->impl_->sampler =
      std::thread([s = server.get(), first] { s->SampleLoop(first); });
  SPDLOG_INFO("live page at http://{}/ (/metrics beside it)", server->address_);
  return server;
}

WebServer::~WebServer() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stop = true;
    impl_->wake.SignalAll();
  }
  if (impl_->sampler.joinable()) impl_->sampler.join();
  if (impl_->ctx == nullptr) return;
  // civetweb's listening thread sees mg_stop's flag only when its poll of
  // the listening socket returns, which it does every 2 s when no
  // connection comes: connect to it until mg_stop has returned, so a
  // server stops in milliseconds.
  absl::Mutex mu;
  bool stopped = false;
  std::thread stopper([&] {
    mg_stop(impl_->ctx);
    absl::MutexLock lock(&mu);
    stopped = true;
  });
  const int port = std::stoi(address_.substr(address_.rfind(':') + 1));
  std::string host = HostOfAddress(address_);  // IPv6 without brackets
  if (host == "0.0.0.0" || host == "localhost") host = "127.0.0.1";
  for (int i = 0; i < 100; ++i) {
    WakeListener(host, port);
    absl::MutexLock lock(&mu);
    if (mu.AwaitWithTimeout(absl::Condition(&stopped),
                            absl::Milliseconds(50))) {
      break;
    }
  }
  stopper.join();
}

void WebServer::TakeSample() {
  // Stamped with the time its read began: the clock may move while the
  // status is gathered.
  const int64_t taken_ms = UnixMillis(options_.clock);
  proto::ClusterStatus status = source_(/*why=*/false);
  history_.Add(Sample::Of(status, taken_ms));
}

void WebServer::SampleLoop(absl::Time first) {
  // Samples fall on first + k * period of the clock, so a sample that
  // comes late does not move the next one (and a clock that jumps more
  // than a period ahead gets one sample now, not one per period missed).
  absl::Time next = first;
  absl::MutexLock lock(&impl_->mu);
  while (!impl_->stop) {
    next += options_.sample_period;
    const absl::Time now = options_.clock->Now();
    if (next + options_.sample_period <= now) next = now;
    while (!impl_->stop &&
           !options_.clock->AwaitWithDeadline(&impl_->mu, &impl_->wake, next)) {
    }
    if (impl_->stop) break;
    impl_->mu.Unlock();
    TakeSample();
    impl_->mu.Lock();
  }
}

WebServer::Response WebServer::Handle(const std::string& method,
                                      const std::string& path,
                                      const std::string& query,
                                      const std::string& authorization) {
  auto text = [](int code, std::string body) {
    return Response{code, "text/plain; charset=utf-8", std::move(body) + "\n"};
  };
  if (method != "GET" && method != "HEAD") {
    return text(405, absl::StrCat("the live page is read-only: ", method,
                                  " is not served"));
  }
  if (const Asset* asset = FindAsset(path)) {
    return Response{200, std::string(asset->content_type),
                    std::string(asset->body)};
  }
  if (path != "/api/status" && path != "/metrics") {
    return text(
        404,
        absl::StrCat(path, " is not served here (/, /api/status, /metrics)"));
  }
  absl::StatusOr<Viewer> viewer = ViewerOf(secret_, authorization);
  if (!viewer.ok()) {
    return text(viewer.status().code() == absl::StatusCode::kUnauthenticated
                    ? 401
                    : 403,
                std::string(viewer.status().message()));
  }
  proto::ClusterStatus status = source_(/*why=*/true);
  ShowOnly(*viewer, &status);
  if (path == "/metrics") {
    return Response{200, "text/plain; version=0.0.4; charset=utf-8",
                    MetricsText(status)};
  }
  int64_t since = 0;
  for (absl::string_view kv : absl::StrSplit(query, '&')) {
    if (absl::ConsumePrefix(&kv, "since=")) (void)absl::SimpleAtoi(kv, &since);
  }
  std::string status_json;
  google::protobuf::util::JsonPrintOptions json;
  json.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(status, &status_json, json);
  return Response{
      200, "application/json",
      absl::StrCat("{\"viewer\":\"", viewer->Describe(), "\",\"now_ms\":",
                   UnixMillis(options_.clock), ",\"status\":", status_json,
                   ",\"history\":", HistoryJson(history_.Since(since)), "}")};
}

}  // namespace plexus::web

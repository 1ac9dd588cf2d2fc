#include "plexus/web/web_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "plexus/web/viewer.h"

namespace plexus::web {
namespace {

struct Reply {
  int code = 0;
  std::string headers;
  std::string body;
};

// One HTTP/1.0 request over loopback; the server closes when done.
Reply Request(const std::string& address, const std::string& request_line,
              const std::string& headers = "") {
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  const std::string req = absl::StrCat(request_line, " HTTP/1.0\r\n", headers,
                                       "Connection: close\r\n\r\n");
  EXPECT_EQ(write(fd, req.data(), req.size()),
            static_cast<ssize_t>(req.size()));
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) all.append(buf, n);
  close(fd);
  Reply r;
  const size_t end = all.find("\r\n\r\n");
  r.headers = all.substr(0, end);
  r.body = end == std::string::npos ? "" : all.substr(end + 4);
  if (all.size() > 12) (void)absl::SimpleAtoi(all.substr(9, 3), &r.code);
  return r;
}

class WebServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    secret_ = *ClusterSecret::Generate();
    WebOptions options;
    options.clock = &clock_;
    auto server = WebServer::Start(options, secret_, [this](bool why) {
      absl::MutexLock lock(&mu_);
      ++reads_;
      proto::ClusterStatus st;
      st.set_calls_routed(reads_);
      st.set_address("127.0.0.1:1");
      for (auto [id, tenant] :
           {std::pair<uint64_t, const char*>{1, "a"}, {2, "b"}}) {
        auto* c = st.add_clients();
        c->set_client_id(id);
        c->set_tenant(tenant);
        if (why) st.add_why()->set_client_id(id);
      }
      auto* w = st.add_workers();
      w->set_worker_id(1);
      w->set_host_name("host0");
      w->set_alive(true);
      w->add_devices()->set_index(0);
      w->mutable_stats()->add_device_busy_micros(reads_ * 1000);
      return st;
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::string Auth(const std::string& token) {
    return absl::StrCat("Authorization: Bearer ", token, "\r\n");
  }

  FakeClock clock_{absl::FromUnixSeconds(1'700'000'000)};
  ClusterSecret secret_;
  absl::Mutex mu_;
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<WebServer> server_;
};

TEST_F(WebServerTest, ServesThePageWithoutAToken) {
  EXPECT_NE(server_->address(), "127.0.0.1:0");
  Reply page = Request(server_->address(), "GET /");
  EXPECT_EQ(page.code, 200) << page.headers;
  EXPECT_NE(page.body.find("<title>Plexus</title>"), std::string::npos);
  EXPECT_NE(page.headers.find("Content-Security-Policy: default-src 'self'"),
            std::string::npos)
      << page.headers;
  Reply chart = Request(server_->address(), "GET /chart.js");
  EXPECT_EQ(chart.code, 200);
  EXPECT_GT(chart.body.size(), 100000u);  // Chart.js itself
  EXPECT_EQ(Request(server_->address(), "GET /app.js").code, 200);
  EXPECT_EQ(Request(server_->address(), "GET /nothing").code, 404);
  EXPECT_EQ(Request(server_->address(), "POST /api/status").code, 405);
}

TEST_F(WebServerTest, StatusAndMetricsNeedAToken) {
  Reply none = Request(server_->address(), "GET /api/status");
  EXPECT_EQ(none.code, 401);
  EXPECT_NE(none.headers.find("WWW-Authenticate: Bearer"), std::string::npos);
  EXPECT_NE(none.body.find("plexus token --admin"), std::string::npos);
  Reply wrong = Request(server_->address(), "GET /metrics",
                        Auth(OperatorToken(*ClusterSecret::Generate())));
  EXPECT_EQ(wrong.code, 403);
  EXPECT_EQ(wrong.body.find("plexus_"), std::string::npos);
}

TEST_F(WebServerTest, TheOperatorSeesEverything) {
  Reply r = Request(server_->address(), "GET /api/status",
                    Auth(OperatorToken(secret_)));
  ASSERT_EQ(r.code, 200) << r.body;
  nlohmann::json j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["viewer"], "operator");
  EXPECT_EQ(j["status"]["clients"].size(), 2u);
  EXPECT_EQ(j["status"]["why"].size(), 2u);
  EXPECT_EQ(j["status"]["workers"][0]["host_name"], "host0");
  EXPECT_GE(j["history"]["t"].size(), 1u);  // the sampler's first sample
  Reply m =
      Request(server_->address(), "GET /metrics", Auth(OperatorToken(secret_)));
  ASSERT_EQ(m.code, 200);
  EXPECT_NE(m.headers.find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(m.body.find("plexus_client_calls_pending{client=\"2\""),
            std::string::npos);
}

TEST_F(WebServerTest, ATenantSeesItsOwnClients) {
  Reply r = Request(server_->address(), "GET /api/status",
                    Auth(TenantToken(secret_, "a")));
  ASSERT_EQ(r.code, 200) << r.body;
  nlohmann::json j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["viewer"], "tenant a");
  ASSERT_EQ(j["status"]["clients"].size(), 1u);
  EXPECT_EQ(j["status"]["clients"][0]["client_id"], "1");
  EXPECT_EQ(j["status"]["why"].size(), 1u);
  Reply m = Request(server_->address(), "GET /metrics",
                    Auth(TenantToken(secret_, "a")));
  EXPECT_EQ(m.body.find("client=\"2\""), std::string::npos);
}

TEST_F(WebServerTest, SamplesOncePerPeriodOfItsClock) {
  // The sampler reads once at start, then once each time its clock passes
  // a period; a sample enters the history before the next read.
  for (int advanced = 0; advanced <= 4; ++advanced) {
    if (advanced > 0) clock_.Advance(absl::Seconds(1));
    absl::MutexLock lock(&mu_);
    auto read = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return reads_ >= advanced + 1;
    };
    ASSERT_TRUE(
        mu_.AwaitWithTimeout(absl::Condition(&read), absl::Seconds(30)));
    EXPECT_EQ(reads_, advanced + 1);
  }
  const size_t samples = server_->history().size();
  EXPECT_GE(samples, 4u);  // the fifth may still be on its way
  EXPECT_LE(samples, 5u);
  EXPECT_EQ(server_->history().Since(0).front().unix_ms,
            absl::ToUnixMillis(absl::FromUnixSeconds(1'700'000'000)));
}

TEST(WebServerSampleTest, ASampleIsStampedWhenItsReadBegins) {
  // The clock moves while the status is gathered (a slow server, or the
  // test's own clock): the sample keeps the time its read began.
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  struct Reads {
    absl::Mutex mu;
    int n ABSL_GUARDED_BY(mu) = 0;
  } reads;
  WebOptions options;
  options.clock = &clock;
  ClusterSecret secret = *ClusterSecret::Generate();
  auto server = WebServer::Start(options, secret, [&](bool) {
    clock.Advance(absl::Milliseconds(700));
    absl::MutexLock lock(&reads.mu);
    ++reads.n;
    return proto::ClusterStatus();
  });
  ASSERT_TRUE(server.ok()) << server.status();
  // The first sample enters the history before the second read begins.
  for (int want = 1; want <= 2; ++want) {
    if (want == 2) clock.Advance(absl::Seconds(1));
    absl::MutexLock lock(&reads.mu);
    auto read = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reads.mu) {
      return reads.n >= want;
    };
    ASSERT_TRUE(
        reads.mu.AwaitWithTimeout(absl::Condition(&read), absl::Seconds(30)));
  }
  ASSERT_GE((*server)->history().size(), 1u);
  EXPECT_EQ((*server)->history().Since(0).front().unix_ms,
            absl::ToUnixMillis(absl::FromUnixSeconds(1'700'000'000)));
}

TEST(WebServerStartTest, AnAddressInUseIsAnErrorNamingIt) {
  ClusterSecret secret = *ClusterSecret::Generate();
  auto status = [](bool) { return proto::ClusterStatus(); };
  auto first = WebServer::Start(WebOptions(), secret, status);
  ASSERT_TRUE(first.ok()) << first.status();
  WebOptions same;
  same.listen = (*first)->address();
  auto second = WebServer::Start(same, secret, status);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(same.listen), std::string::npos)
      << second.status();
}

}  // namespace
}  // namespace plexus::web

#include "plexus/web/viewer.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace plexus::web {
namespace {

ClusterSecret Secret() { return *ClusterSecret::Generate(); }

TEST(ViewerTest, TheOperatorTokenIsTheOperator) {
  ClusterSecret secret = Secret();
  absl::StatusOr<Viewer> v =
      ViewerOf(secret, absl::StrCat("Bearer ", OperatorToken(secret)));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->is_operator);
  EXPECT_EQ(v->Describe(), "operator");
}

TEST(ViewerTest, ATenantTokenIsThatTenant) {
  ClusterSecret secret = Secret();
  absl::StatusOr<Viewer> v = ViewerOf(
      secret, absl::StrCat("bearer  ", TenantToken(secret, "research"), " "));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->is_operator);
  EXPECT_EQ(v->tenant, "research");
  EXPECT_EQ(v->Describe(), "tenant research");
}

TEST(ViewerTest, RefusesWhatIsNotATokenOfThisCluster) {
  ClusterSecret secret = Secret();
  ClusterSecret other = Secret();
  EXPECT_EQ(ViewerOf(secret, "").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ViewerOf(secret, "Basic dXNlcjpwYXNz").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ViewerOf(secret, absl::StrCat("Bearer ", OperatorToken(other)))
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  // A tenant's token is not the operator's, nor another tenant's.
  const std::string research = TenantToken(secret, "research");
  const std::string hex = research.substr(research.find(':') + 1);
  EXPECT_EQ(ViewerOf(secret, absl::StrCat("Bearer ", hex)).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::Status s = ViewerOf(secret, absl::StrCat("Bearer prod:", hex)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("tenant prod"), std::string::npos) << s;
  EXPECT_EQ(ViewerOf(secret, "Bearer zz").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      ViewerOf(secret, absl::StrCat("Bearer bad name:", hex)).status().code(),
      absl::StatusCode::kPermissionDenied);
}

TEST(ViewerTest, ATenantSeesOnlyItsOwnClients) {
  proto::ClusterStatus st;
  for (auto [id, tenant] :
       {std::pair<uint64_t, const char*>{1, "a"}, {2, "b"}, {3, "a"}}) {
    auto* c = st.add_clients();
    c->set_client_id(id);
    c->set_tenant(tenant);
    st.add_slices()->set_client_id(id);
    st.add_pending_slices()->set_client_id(id);
    st.add_why()->set_client_id(id);
    st.add_graphs()->set_client_id(id);
  }
  auto* w = st.add_workers();
  w->set_host_name("h0");
  for (uint64_t id : {1, 2, 3})
    w->mutable_stats()->add_clients()->set_client_id(id);

  proto::ClusterStatus all = st;
  ShowOnly(Viewer{.is_operator = true}, &all);
  EXPECT_EQ(all.clients_size(), 3);

  ShowOnly(Viewer{.is_operator = false, .tenant = "a"}, &st);
  ASSERT_EQ(st.clients_size(), 2);
  EXPECT_EQ(st.clients(0).client_id(), 1u);
  EXPECT_EQ(st.clients(1).client_id(), 3u);
  EXPECT_EQ(st.slices_size(), 2);
  EXPECT_EQ(st.pending_slices_size(), 2);
  EXPECT_EQ(st.why_size(), 2);
  for (const auto& e : st.why()) EXPECT_NE(e.client_id(), 2u);
  EXPECT_EQ(st.graphs_size(), 2);
  for (const auto& g : st.graphs()) EXPECT_NE(g.client_id(), 2u);
  ASSERT_EQ(st.workers_size(), 1);  // the hosts stay: shared capacity
  EXPECT_EQ(st.workers(0).stats().clients_size(), 2);
}

}  // namespace
}  // namespace plexus::web

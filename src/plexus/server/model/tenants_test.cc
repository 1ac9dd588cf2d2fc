#include "plexus/server/model/tenants.h"

#include "gtest/gtest.h"

namespace plexus {
namespace {

TEST(TenantTableTest, UnsetTenantsAndFieldsInheritTheDefault) {
  auto table = TenantTable::FromJson(R"({
    "default": {"weight": 2, "max_calls_in_flight": 8},
    "tenants": {"research": {"weight": 8, "max_devices": 4},
                "prod": {"priority": 10}, "batch": {"priority": -5}}})");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->For("research").weight, 8);
  EXPECT_EQ(table->For("research").max_devices, 4);
  EXPECT_EQ(table->For("research").max_calls_in_flight, 8);
  EXPECT_EQ(table->For("anyone").weight, 2);
  EXPECT_EQ(table->For("anyone").max_devices, 0);
  EXPECT_EQ(table->For("prod").priority, 10);
  EXPECT_EQ(table->For("batch").priority, -5);
  EXPECT_EQ(table->For("anyone").priority, 0);
  EXPECT_EQ(TenantTable().For("x").max_calls_in_flight,
            TenantPolicy::kDefaultCallsInFlight);
}

TEST(TenantTableTest, ErrorsNameTheTenantAndField) {
  auto weight = TenantTable::FromJson(R"({"tenants": {"a": {"weight": 0}}})");
  EXPECT_EQ(weight.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(weight.status().message().find("a.weight"), std::string::npos)
      << weight.status();
  auto unknown = TenantTable::FromJson(R"({"tenants": {"b": {"wieght": 1}}})");
  EXPECT_NE(unknown.status().message().find("\"wieght\""), std::string::npos)
      << unknown.status();
  auto negative = TenantTable::FromJson(R"({"default": {"max_bytes": -1}})");
  EXPECT_NE(negative.status().message().find("default.max_bytes"),
            std::string::npos)
      << negative.status();
  auto priority =
      TenantTable::FromJson(R"({"tenants": {"p": {"priority": 1001}}})");
  EXPECT_NE(priority.status().message().find(
                "p.priority must be an integer from -1000 to 1000"),
            std::string::npos)
      << priority.status();
  EXPECT_FALSE(
      TenantTable::FromJson(R"({"tenants": {"p": {"priority": 1.5}}})").ok());
  EXPECT_FALSE(TenantTable::FromJson("not json").ok());
  EXPECT_EQ(TenantTable::Load("/nonexistent/tenants.json").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace plexus

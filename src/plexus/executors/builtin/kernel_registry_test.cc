#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/builtin/kernel.h"
#include "plexus/executors/builtin/kernel_test_util.h"

namespace plexus::builtin {
namespace {

using ::plexus::builtin::testing::MessageOf;
using ::testing::HasSubstr;

TEST(KernelRegistryTest, EveryCataloguedKernelHasABodyAndNoOtherBody) {
  ASSERT_TRUE(KernelRegistry::Builtin().ok())
      << KernelRegistry::Builtin().status();
  EXPECT_EQ(KernelRegistry::Global().Names(),
            KernelCatalogue::Global().Names());
  for (const std::string& name : KernelRegistry::Global().Names()) {
    EXPECT_EQ(&KernelRegistry::Global().Find(name)->signature(),
              KernelCatalogue::Global().Find(name))
        << name;
  }
}

TEST(KernelRegistryTest, UnknownKernelIsNull) {
  EXPECT_EQ(KernelRegistry::Global().Find("no_such_kernel"), nullptr);
}

class FakeSignature : public KernelSignature {
 public:
  absl::StatusOr<std::vector<ArgSpec>> InferOutputs(
      const std::vector<ArgSpec>&, int, const Attrs&) const override {
    return std::vector<ArgSpec>{};
  }
};

class FakeBody : public KernelBody {
 public:
  absl::Status Run(const KernelContext&) const override {
    return absl::OkStatus();
  }
};

KernelCatalogue CatalogueOf(const std::vector<std::string>& names) {
  KernelCatalogue catalogue;
  for (const std::string& name : names) {
    KernelDoc doc;
    doc.summary = "a fake";
    catalogue.Register(name, std::make_unique<FakeSignature>(), doc);
  }
  return catalogue;
}

KernelBodies BodiesOf(const std::vector<std::string>& names) {
  KernelBodies bodies;
  for (const std::string& name : names) {
    bodies.emplace_back(name, std::make_unique<FakeBody>());
  }
  return bodies;
}

TEST(KernelRegistryTest, PairsSignaturesWithBodiesByName) {
  const KernelCatalogue catalogue = CatalogueOf({"b", "a"});
  auto registry = KernelRegistry::Create(catalogue, BodiesOf({"a", "b"}));
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_EQ((*registry)->Names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(&(*registry)->Find("b")->signature(), catalogue.Find("b"));
}

TEST(KernelRegistryTest, ASignatureWithoutABodyIsRefused) {
  const KernelCatalogue catalogue = CatalogueOf({"a", "b", "c"});
  EXPECT_EQ(MessageOf(KernelRegistry::Create(catalogue, BodiesOf({"a", "c"}))),
            "kernel 'b' is in the catalogue but has no body");
  EXPECT_EQ(MessageOf(KernelRegistry::Create(catalogue, BodiesOf({"a", "b"}))),
            "kernel 'c' is in the catalogue but has no body");
}

TEST(KernelRegistryTest, ABodyWithoutASignatureIsRefused) {
  const KernelCatalogue catalogue = CatalogueOf({"b", "d"});
  EXPECT_EQ(
      MessageOf(KernelRegistry::Create(catalogue, BodiesOf({"a", "b", "d"}))),
      "kernel 'a' has a body but is not in the catalogue");
  EXPECT_EQ(
      MessageOf(KernelRegistry::Create(catalogue, BodiesOf({"b", "c", "d"}))),
      "kernel 'c' has a body but is not in the catalogue");
  EXPECT_EQ(
      MessageOf(KernelRegistry::Create(catalogue, BodiesOf({"b", "d", "e"}))),
      "kernel 'e' has a body but is not in the catalogue");
  EXPECT_EQ(
      MessageOf(KernelRegistry::Create(catalogue, BodiesOf({"b", "b", "d"}))),
      "kernel 'b' has two bodies");
}

TEST(KernelTest, RunWithMissingBuffersFailsInsteadOfCrashing) {
  KernelContext ctx;
  const Attrs attrs;
  ctx.attrs = &attrs;
  for (const std::string& name : KernelRegistry::Global().Names()) {
    EXPECT_THAT(MessageOf(KernelRegistry::Global().Find(name)->Run(ctx)),
                HasSubstr(name + " takes"));
  }
}

}  // namespace
}  // namespace plexus::builtin

#include "plexus/executors/builtin/catalogue.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plexus/executors/builtin/attrs.h"

// The catalogue alone, as the server and the client link it: no bodies.
namespace plexus::builtin {
namespace {

using ::testing::HasSubstr;
using ::testing::IsSupersetOf;

template <typename S>
std::string MessageOf(const S& status_or) {
  if constexpr (std::is_same_v<S, absl::Status>) {
    return status_or.ok() ? "OK" : std::string(status_or.message());
  } else {
    return status_or.ok() ? "OK" : std::string(status_or.status().message());
  }
}

ArgSpec Arg(DType dtype, Shape shape) {
  return {{dtype, std::move(shape)}, Sharding::Replicated()};
}

absl::StatusOr<std::vector<ArgSpec>> Infer(const std::string& kernel,
                                           const std::vector<ArgSpec>& args,
                                           const Attrs& attrs = {}) {
  return KernelCatalogue::Global().Find(kernel)->InferOutputs(args, 1, attrs);
}

TEST(KernelCatalogueTest, EveryBuiltinKernelIsRegisteredAndNamesAreSorted) {
  const std::vector<std::string> names = KernelCatalogue::Global().Names();
  EXPECT_THAT(names, IsSupersetOf(
                         {"add", "mul", "scale", "identity", "matmul", "relu",
                          "relu_grad", "bias_add", "reduce_sum", "softmax_xent",
                          "softmax_xent_grad", "sgd_update", "all_reduce",
                          "assert_finite", "busy_wait", "fill", "iota"}));
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST(KernelCatalogueTest, OnlyAllReduceIsCollective) {
  for (const std::string& name : KernelCatalogue::Global().Names()) {
    EXPECT_EQ(KernelCatalogue::Global().Find(name)->is_collective(),
              name == "all_reduce")
        << name;
  }
}

TEST(KernelCatalogueTest, UnknownKernelIsNull) {
  EXPECT_EQ(KernelCatalogue::Global().Find("no_such_kernel"), nullptr);
  EXPECT_EQ(KernelCatalogue::Global().FindDoc("no_such_kernel"), nullptr);
}

TEST(KernelCatalogueTest, EveryKernelIsDocumentedWithAnExample) {
  for (const std::string& name : KernelCatalogue::Global().Names()) {
    const KernelDoc* doc = KernelCatalogue::Global().FindDoc(name);
    ASSERT_NE(doc, nullptr) << name;
    EXPECT_FALSE(doc->summary.empty()) << name;
    EXPECT_FALSE(doc->inputs.empty()) << name;
    EXPECT_FALSE(doc->outputs.empty()) << name;
    // The example runs the program it documents and checks what it got.
    EXPECT_THAT(doc->example, HasSubstr("\"" + name + "\"")) << name;
    EXPECT_THAT(doc->example, HasSubstr("assert")) << name;
    for (const KernelDoc::Attr& attr : doc->attrs) {
      EXPECT_THAT((std::vector<std::string>{"float", "int", "string", "ints"}),
                  ::testing::Contains(attr.kind))
          << name << " attribute " << attr.name;
      EXPECT_FALSE(attr.meaning.empty()) << name << " attribute " << attr.name;
    }
  }
}

TEST(AttrsTest, FloatAcceptsIntegersAndFallsBack) {
  Attrs attrs{{"lr", 0.5}, {"steps", int64_t{3}}};
  EXPECT_EQ(*GetFloatAttr(attrs, "lr"), 0.5);
  EXPECT_EQ(*GetFloatAttr(attrs, "steps"), 3.0);
  EXPECT_EQ(*GetFloatAttr(attrs, "momentum", 0.9), 0.9);
}

TEST(AttrsTest, WrongKindNamesTheAttributeAndBothKinds) {
  Attrs attrs{{"lr", std::string("fast")},
              {"axis", 1.5},
              {"shape", int64_t{4}},
              {"dtype", std::vector<int64_t>{1}}};
  EXPECT_EQ(MessageOf(GetFloatAttr(attrs, "lr")),
            "attribute 'lr' must be a number, got a string");
  EXPECT_EQ(MessageOf(GetIntAttr(attrs, "axis")),
            "attribute 'axis' must be an integer, got a float");
  EXPECT_EQ(MessageOf(GetIntsAttr(attrs, "shape")),
            "attribute 'shape' must be a list of integers, got an integer");
  EXPECT_EQ(MessageOf(GetStringAttr(attrs, "dtype")),
            "attribute 'dtype' must be a string, got a list of integers");
}

TEST(AttrsTest, MissingWithoutFallbackIsAnError) {
  const Attrs attrs;
  EXPECT_EQ(MessageOf(GetFloatAttr(attrs, "lr")), "missing attribute 'lr'");
  EXPECT_EQ(MessageOf(GetIntAttr(attrs, "axis")), "missing attribute 'axis'");
  EXPECT_EQ(MessageOf(GetStringAttr(attrs, "dtype")),
            "missing attribute 'dtype'");
  EXPECT_EQ(MessageOf(GetIntsAttr(attrs, "shape")),
            "missing attribute 'shape'");
  EXPECT_EQ(*GetStringAttr(attrs, "dtype", "float32"), "float32");
  EXPECT_EQ(*GetIntAttr(attrs, "axis", -1), -1);
}

TEST(AttrsTest, PresentValuesWin) {
  Attrs attrs{{"dtype", std::string("int32")},
              {"shape", std::vector<int64_t>{2, 3}}};
  EXPECT_EQ(*GetStringAttr(attrs, "dtype", "float32"), "int32");
  EXPECT_EQ(*GetIntsAttr(attrs, "shape"), (std::vector<int64_t>{2, 3}));
}

TEST(KernelCatalogueTest, WrongArgumentCountIsReported) {
  auto out = Infer("add", {Arg(DType::kF32, {4})});
  EXPECT_EQ(MessageOf(out), "expected 2 arguments, got 1");
  out = Infer("fill", {Arg(DType::kF32, {4})},
              {{"shape", std::vector<int64_t>{4}}});
  EXPECT_EQ(MessageOf(out), "expected 0 arguments, got 1");
}

TEST(KernelCatalogueTest, OnlyElementwiseKernelsTakeMeshShardings) {
  std::vector<std::string> takers;
  for (const std::string& name : KernelCatalogue::Global().Names()) {
    if (KernelCatalogue::Global().Find(name)->TakesMeshShardings()) {
      takers.push_back(name);
    }
  }
  EXPECT_EQ(takers,
            (std::vector<std::string>{"add", "identity", "mul", "relu",
                                      "relu_grad", "scale", "sgd_update"}));
}

}  // namespace
}  // namespace plexus::builtin

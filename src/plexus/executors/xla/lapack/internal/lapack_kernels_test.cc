// The LAPACK routines behind the handlers, on small matrices whose answers
// are known or checked by their definition (A = P L U, A = L L^T,
// A v = lambda v, ...), batched, and on the data LAPACK reports through
// info (singular, not positive definite).
#include "plexus/executors/xla/lapack/internal/lapack_kernels.h"

#include <cmath>
#include <complex>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace plexus::xla::lapack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Column-major n x n from rows written row by row.
template <typename T>
std::vector<T> ColumnMajor(int rows, int cols, std::vector<T> row_major) {
  std::vector<T> out(row_major.size());
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) out[i + j * rows] = row_major[i * cols + j];
  }
  return out;
}

// a (m x k) times b (k x n), column-major.
template <typename T>
std::vector<T> Multiply(const T* a, const T* b, int m, int k, int n) {
  std::vector<T> c(static_cast<size_t>(m) * n, T(0));
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      for (int l = 0; l < k; ++l) c[i + j * m] += a[i + l * m] * b[l + j * k];
    }
  }
  return c;
}

template <typename T>
void ExpectNear(const std::vector<T>& got, const std::vector<T>& want,
                double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(std::abs(got[i] - want[i]), 0, tolerance) << "element " << i;
  }
}

TEST(LapackKernelsTest, GetrfFactorsEveryMatrixOfTheBatchAndReportsSingular) {
  // Two 3x3: one regular (a pivot is needed), one singular.
  std::vector<double> a =
      ColumnMajor<double>(3, 3, {0, 2, 1, 1, 1, 1, 4, 0, 3});
  std::vector<double> singular =
      ColumnMajor<double>(3, 3, {1, 2, 3, 2, 4, 6, 1, 0, 1});
  std::vector<double> both = a;
  both.insert(both.end(), singular.begin(), singular.end());
  std::vector<int32_t> ipiv(6);
  std::vector<int32_t> info(2, -7);
  ASSERT_TRUE(
      Getrf(MatrixBatch<double>{both.data(), 2, 3, 3}, ipiv.data(), info.data())
          .ok());
  EXPECT_EQ(info[0], 0);
  EXPECT_GT(info[1], 0);  // U(info, info) is exactly zero
  // Rebuild P L U of the first and compare with a.
  std::vector<double> l(9, 0), u(9, 0);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) {
      const double v = both[i + 3 * j];
      if (i > j) l[i + 3 * j] = v;
      if (i == j) l[i + 3 * j] = 1;
      if (i <= j) u[i + 3 * j] = v;
    }
  }
  std::vector<double> lu = Multiply(l.data(), u.data(), 3, 3, 3);
  // ipiv is 1-based: undo the swaps, last first.
  for (int i = 2; i >= 0; --i) {
    ASSERT_GE(ipiv[i], 1);
    ASSERT_LE(ipiv[i], 3);
    const int p = ipiv[i] - 1;
    for (int j = 0; j < 3; ++j) std::swap(lu[i + 3 * j], lu[p + 3 * j]);
  }
  ExpectNear(lu, a, 1e-12);
  EXPECT_EQ(ipiv[0], 3);  // the first column's largest entry is in row 3
}

TEST(LapackKernelsTest, PotrfFactorsAndReportsANonPositiveDefiniteMatrix) {
  std::vector<float> a = ColumnMajor<float>(2, 2, {4, 2, 2, 3});
  std::vector<float> not_pd = ColumnMajor<float>(2, 2, {1, 2, 2, 1});
  std::vector<float> both = a;
  both.insert(both.end(), not_pd.begin(), not_pd.end());
  std::vector<int32_t> info(2, -7);
  ASSERT_TRUE(
      Potrf('L', MatrixBatch<float>{both.data(), 2, 2, 2}, info.data()).ok());
  EXPECT_THAT(info, ElementsAre(0, 2));
  // L = [[2, 0], [1, sqrt(2)]]; the upper triangle is left as it was.
  EXPECT_FLOAT_EQ(both[0], 2);
  EXPECT_FLOAT_EQ(both[1], 1);
  EXPECT_FLOAT_EQ(both[2], 2);
  EXPECT_FLOAT_EQ(both[3], std::sqrt(2.0f));
}

TEST(LapackKernelsTest, SyevdAndHeevdGiveAscendingEigenvaluesAndVectors) {
  std::vector<double> a = ColumnMajor<double>(2, 2, {2, 1, 1, 2});
  std::vector<double> w(2);
  int32_t info = -7;
  ASSERT_TRUE(
      Syevd('V', 'L', MatrixBatch<double>{a.data(), 1, 2, 2}, w.data(), &info)
          .ok());
  EXPECT_EQ(info, 0);
  EXPECT_NEAR(w[0], 1, 1e-12);
  EXPECT_NEAR(w[1], 3, 1e-12);
  EXPECT_NEAR(std::abs(a[0]), std::sqrt(0.5), 1e-12);  // (1, -1) / sqrt 2
  EXPECT_NEAR(a[0], -a[1], 1e-12);

  using C = std::complex<float>;
  // Hermitian [[2, -i], [i, 2]]: eigenvalues 1 and 3; only 'U' is read.
  std::vector<C> h = ColumnMajor<C>(2, 2, {2, C(0, -1), C(99, 99), 2});
  std::vector<float> hw(2);
  ASSERT_TRUE(
      Syevd('V', 'U', MatrixBatch<C>{h.data(), 1, 2, 2}, hw.data(), &info)
          .ok());
  EXPECT_EQ(info, 0);
  EXPECT_NEAR(hw[0], 1, 1e-5);
  EXPECT_NEAR(hw[1], 3, 1e-5);
}

TEST(LapackKernelsTest, GesddGivesSingularValuesWithAndWithoutVectors) {
  // 3x2 with singular values 3 and 2.
  const std::vector<float> a = ColumnMajor<float>(3, 2, {0, 2, 3, 0, 0, 0});
  std::vector<float> x = a;
  std::vector<float> s(2), u(9), vt(4);
  int32_t info = -7;
  ASSERT_TRUE(Gesdd('A', MatrixBatch<float>{x.data(), 1, 3, 2}, s.data(),
                    MatrixBatch<float>{u.data(), 1, 3, 3},
                    MatrixBatch<float>{vt.data(), 1, 2, 2}, &info)
                  .ok());
  EXPECT_EQ(info, 0);
  EXPECT_THAT(s, ElementsAre(3, 2));
  // U[:, :2] diag(s) Vt == a.
  std::vector<float> us(6);
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 3; ++i) us[i + 3 * j] = u[i + 3 * j] * s[j];
  }
  ExpectNear(Multiply(us.data(), vt.data(), 3, 2, 2), a, 1e-6);

  x = a;
  std::fill(s.begin(), s.end(), 0);
  ASSERT_TRUE(Gesdd('N', MatrixBatch<float>{x.data(), 1, 3, 2}, s.data(),
                    MatrixBatch<float>{u.data(), 1, 3, 3},
                    MatrixBatch<float>{vt.data(), 1, 2, 2}, &info)
                  .ok());
  EXPECT_THAT(s, ElementsAre(3, 2));

  // The QR algorithm, the first k vectors: the same factorisation.
  x = a;
  std::vector<float> u2(6);
  ASSERT_TRUE(Gesvd('S', MatrixBatch<float>{x.data(), 1, 3, 2}, s.data(),
                    MatrixBatch<float>{u2.data(), 1, 3, 2},
                    MatrixBatch<float>{vt.data(), 1, 2, 2}, &info)
                  .ok());
  EXPECT_EQ(info, 0);
  EXPECT_THAT(s, ElementsAre(3, 2));
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 3; ++i) us[i + 3 * j] = u2[i + 3 * j] * s[j];
  }
  ExpectNear(Multiply(us.data(), vt.data(), 3, 2, 2), a, 1e-6);
}

TEST(LapackKernelsTest, GeqrfThenOrgqrGiveOrthonormalQWithQRBeingA) {
  const std::vector<double> a = ColumnMajor<double>(3, 2, {1, 2, 3, 4, 5, 7});
  std::vector<double> qr = a;
  std::vector<double> tau(2);
  ASSERT_TRUE(Geqrf(MatrixBatch<double>{qr.data(), 1, 3, 2}, tau.data()).ok());
  std::vector<double> r = {qr[0], 0, qr[3], qr[4]};  // 2x2 upper
  std::vector<double> q = qr;
  ASSERT_TRUE(
      Orgqr(MatrixBatch<double>{q.data(), 1, 3, 2}, tau.data(), 2).ok());
  ExpectNear(Multiply(q.data(), r.data(), 3, 2, 2), a, 1e-12);
  std::vector<double> qt(6);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) qt[j + 2 * i] = q[i + 3 * j];
  }
  ExpectNear(Multiply(qt.data(), q.data(), 2, 3, 2), {1, 0, 0, 1}, 1e-12);

  EXPECT_THAT(
      Orgqr(MatrixBatch<double>{q.data(), 1, 2, 3}, tau.data(), 2).message(),
      HasSubstr("dorgqr: 2x3 matrices with 2 reflectors each"));
}

TEST(LapackKernelsTest, RealGeevUnpacksAComplexPairIntoConjugateVectors) {
  // A rotation by 90 degrees and a 1: eigenvalues +i, -i and 1.
  const std::vector<float> a =
      ColumnMajor<float>(3, 3, {0, -1, 0, 1, 0, 0, 0, 0, 1});
  std::vector<float> wr(3), wi(3);
  using C = std::complex<float>;
  std::vector<C> vl(9), vr(9);
  int32_t info = -7;
  ASSERT_TRUE(RealGeev('V', 'V', MatrixBatch<const float>{a.data(), 1, 3, 3},
                       wr.data(), wi.data(), vl.data(), vr.data(), &info)
                  .ok());
  ASSERT_EQ(info, 0);
  std::vector<C> ac(a.begin(), a.end());
  for (int j = 0; j < 3; ++j) {
    const C lambda(wr[j], wi[j]);
    // A v = lambda v, and u^H A = lambda u^H for the left ones.
    std::vector<C> av = Multiply(ac.data(), vr.data() + 3 * j, 3, 3, 1);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(std::abs(av[i] - lambda * vr[3 * j + i]), 0, 1e-6)
          << "eigenpair " << j;
    }
    std::vector<C> uh(3);
    for (int i = 0; i < 3; ++i) uh[i] = std::conj(vl[3 * j + i]);
    std::vector<C> uha = Multiply(uh.data(), ac.data(), 1, 3, 3);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(std::abs(uha[i] - lambda * uh[i]), 0, 1e-6);
    }
  }
  // The pair: +i first, its vector the conjugate of the next one's.
  const int p = wi[0] != 0 ? 0 : 1;
  EXPECT_GT(wi[p], 0);
  EXPECT_EQ(wi[p + 1], -wi[p]);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(vr[3 * (p + 1) + i], std::conj(vr[3 * p + i]));
  }
}

TEST(LapackKernelsTest, ComplexGeevGivesEigenpairs) {
  using C = std::complex<double>;
  const std::vector<C> a = ColumnMajor<C>(2, 2, {C(1, 1), 2, 0, C(0, -1)});
  std::vector<C> w(2), vl(4), vr(4);
  int32_t info = -7;
  ASSERT_TRUE(ComplexGeev('N', 'V', MatrixBatch<const C>{a.data(), 1, 2, 2},
                          w.data(), vl.data(), vr.data(), &info)
                  .ok());
  ASSERT_EQ(info, 0);
  for (int j = 0; j < 2; ++j) {
    std::vector<C> av = Multiply(a.data(), vr.data() + 2 * j, 2, 2, 1);
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(std::abs(av[i] - w[j] * vr[2 * j + i]), 0, 1e-12);
    }
  }
}

TEST(LapackKernelsTest, TrsmSolvesEachSideAndTranspose) {
  // L = [[2, 0], [1, 4]], b = [[2, 4], [9, 14]].
  const std::vector<double> l = ColumnMajor<double>(2, 2, {2, 0, 1, 4});
  const std::vector<double> b = ColumnMajor<double>(2, 2, {2, 4, 9, 14});
  std::vector<double> x = b;
  ASSERT_TRUE(Trsm('L', 'L', 'N', 'N',
                   MatrixBatch<const double>{l.data(), 1, 2, 2},
                   MatrixBatch<double>{x.data(), 1, 2, 2})
                  .ok());
  ExpectNear(Multiply(l.data(), x.data(), 2, 2, 2), b, 1e-12);
  // x L^T = b.
  x = b;
  ASSERT_TRUE(Trsm('R', 'L', 'T', 'N',
                   MatrixBatch<const double>{l.data(), 1, 2, 2},
                   MatrixBatch<double>{x.data(), 1, 2, 2})
                  .ok());
  const std::vector<double> lt = ColumnMajor<double>(2, 2, {2, 1, 0, 4});
  ExpectNear(Multiply(x.data(), lt.data(), 2, 2, 2), b, 1e-12);
}

TEST(LapackKernelsTest, EmptyMatricesAreComputedWithInfoZero) {
  std::vector<int32_t> info(2, -7);
  float unused = 0;
  ASSERT_TRUE(Gesdd('A', MatrixBatch<float>{&unused, 2, 3, 0}, &unused,
                    MatrixBatch<float>{&unused, 2, 3, 3},
                    MatrixBatch<float>{&unused, 2, 0, 0}, info.data())
                  .ok());
  EXPECT_THAT(info, ElementsAre(0, 0));
  info = {-7, -7};
  std::complex<float> c;
  ASSERT_TRUE(RealGeev('V', 'V', MatrixBatch<const float>{&unused, 2, 0, 0},
                       &unused, &unused, &c, &c, info.data())
                  .ok());
  EXPECT_THAT(info, ElementsAre(0, 0));
}

TEST(LapackKernelsTest, RefusesLettersAndShapesLapackDoesNotTake) {
  std::vector<float> a(4, 1);
  int32_t info = 0;
  absl::Status s = Potrf('X', MatrixBatch<float>{a.data(), 1, 2, 2}, &info);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spotrf: uplo is 'X' (88), not one of"));
  std::vector<float> b(6, 1);
  s = Trsm('L', 'L', 'N', 'N', MatrixBatch<const float>{a.data(), 1, 2, 2},
           MatrixBatch<float>{b.data(), 1, 3, 2});
  EXPECT_THAT(s.message(),
              HasSubstr("strsm: side 'L' of 1 3x2 right-hand sides needs 1 "
                        "triangular 3x3 matrices, got 1 of 2x2"));
  s = Getrf(MatrixBatch<float>{a.data(), 1, int64_t{1} << 31, 1}, nullptr,
            &info);
  EXPECT_THAT(s.message(), HasSubstr("does not fit LAPACK's 32-bit sizes"));
}

}  // namespace
}  // namespace plexus::xla::lapack

// What every Plexus benchmark shares: a monotonic stopwatch, the summary of
// repeated measurements (median, min, max) and number formatting. Header
// only; plain functions and values, safe to use from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace plexus::bench {

// Seconds on the monotonic clock.
inline double NowSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The repeats of one measurement. Samples stay in the order they were taken.
struct Summary {
  std::vector<double> samples;

  double median() const {
    if (samples.empty()) return 0;
    std::vector<double> s = samples;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }
  double min() const {
    return samples.empty() ? 0
                           : *std::min_element(samples.begin(), samples.end());
  }
  double max() const {
    return samples.empty() ? 0
                           : *std::max_element(samples.begin(), samples.end());
  }
  nlohmann::json ToJson() const {
    return {{"median", median()},
            {"min", min()},
            {"max", max()},
            {"samples", samples}};
  }
};

// 31234.5 -> "31,234" (rounded to an integer, thousands separated).
inline std::string Grouped(double value) {
  const bool negative = value < 0;
  std::string digits = absl::StrFormat("%.0f", std::fabs(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return negative ? "-" + out : out;
}

// 4096 -> "4 KiB", 1 << 20 -> "1 MiB".
inline std::string SizeName(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    return absl::StrFormat("%d GiB", bytes >> 30);
  }
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    return absl::StrFormat("%d MiB", bytes >> 20);
  }
  if (bytes >= 1024 && bytes % 1024 == 0) {
    return absl::StrFormat("%d KiB", bytes >> 10);
  }
  return absl::StrFormat("%d B", bytes);
}

// Writes `json` to `path` (nothing when empty) and says where; false if it
// could not be written.
inline bool WriteJson(const std::string& path, const nlohmann::json& json) {
  if (path.empty()) return true;
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::printf("figures written to %s\n", path.c_str());
  return true;
}

}  // namespace plexus::bench

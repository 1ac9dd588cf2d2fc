// The live page's static files, compiled into the binary (embed.cmake):
// the page itself, its script and style, and Chart.js (Debian's
// libjs-chart.js). Nothing is read from disk or fetched at run time.
#pragma once

#include "absl/strings/string_view.h"

namespace plexus::web {

struct Asset {
  absl::string_view content_type;
  absl::string_view body;
};

// The asset served at `path` ("/", "/app.js", "/style.css", "/chart.js"),
// or nullptr.
const Asset* FindAsset(absl::string_view path);

}  // namespace plexus::web
